package reliability

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// FaultKind names a fault the harness injects.
type FaultKind string

// Faults. Handler errors on first attempts and the relay's kill after
// confirm are not in this list: they run continuously, inside the service
// (see Profile.FailFirst and Profile.KillAfterConfirm).
const (
	// FaultConsumerKill SIGKILLs a consumer process (its handlers hold open
	// transactions thanks to the handler delay) and restarts it.
	FaultConsumerKill FaultKind = "consumer-kill"
	// FaultRelayKill SIGKILLs the stand-alone relay process and restarts it.
	FaultRelayKill FaultKind = "relay-kill"
	// FaultRelayStop SIGSTOPs the stand-alone relay process while it
	// holds a claimed batch (its claim transaction open, found in
	// pg_stat_activity), keeps it frozen until PostgreSQL has ended that
	// transaction (RelayLease is its idle_in_transaction_session_timeout)
	// and the other relays could take the rows, then SIGCONTs it: its late
	// settlement must record nothing.
	FaultRelayStop FaultKind = "relay-stop"
	// FaultProducerKill SIGKILLs the producer mid-transaction and restarts it.
	FaultProducerKill FaultKind = "producer-kill"
	// FaultBrokerClose makes the broker close every connection of one
	// consumer process (rabbitmqctl close_connection).
	FaultBrokerClose FaultKind = "broker-close"
	// FaultStopCont SIGSTOPs a consumer process for longer than
	// InboxLockTimeout, has the broker close its connections so that its
	// unacknowledged messages go to another consumer, then SIGCONTs it: its
	// late commits must be refused by the inbox's lock token.
	FaultStopCont FaultKind = "stop-cont"
	// FaultPGRestart restarts PostgreSQL (at most once per run).
	FaultPGRestart FaultKind = "pg-restart"
	// FaultDBClose terminates every database session of one consumer
	// process (pg_terminate_backend on the pg_stat_activity rows carrying
	// its application_name, see workload.ApplicationName): its handlers'
	// transactions fail, its claims and acks fail and its LISTEN
	// connection drops, as in a network cut to the database of that
	// process alone. It is the PostgreSQL transport's broker-close.
	FaultDBClose FaultKind = "db-close"
)

// Transports a profile can run on (Profile.Transport).
const (
	// TransportRabbitMQ runs the processes on rabbitmq.New; the
	// harness needs Env.AMQPURL and Env.Broker.
	TransportRabbitMQ = "rabbitmq"
	// TransportPostgres runs them on pgtransport.New over the
	// run's database (queue tables prefixed like the run's other tables):
	// publishes in a transaction write queue rows in it, so there is no
	// outbox row and no relay traffic. No broker is needed.
	TransportPostgres = "postgres"
)

// Profile is the shape of one reliability run.
type Profile struct {
	Name string
	// Transport is TransportRabbitMQ (also when empty) or
	// TransportPostgres (see ForPostgresTransport).
	Transport string
	// QueueType is the RabbitMQ endpoint queues' type, "classic" (also
	// when empty) or "quorum" (ForCluster).
	QueueType string
	// NodeHold is how long a node fault (FaultNodeKill, FaultNodeStop)
	// keeps its node down before starting it again (ForCluster).
	NodeHold time.Duration
	// Lease is the PostgreSQL transport's Lease (how soon a killed or
	// frozen consumer's message is claimed again); unused on RabbitMQ.
	Lease time.Duration
	// Redelivery is a Watermill preset's redelivery timeout (JetStream
	// AckWait, Redis MaxIdleTime; see ForWatermill).
	Redelivery time.Duration
	// Messages is how many producer transactions must commit.
	Messages int
	// Consumers and Relays count the consumer processes (at least 2 for
	// stop-cont) and the stand-alone relay processes. There is one
	// producer process.
	Consumers, Relays int
	// ProducerWorkers and Rate shape the producer (Rate 0: unthrottled).
	ProducerWorkers int
	Rate            float64
	// Concurrency is each endpoint's ConcurrentMessageLimit.
	Concurrency int

	InboxLockTimeout time.Duration
	RelayLease       time.Duration
	// HandlerDelay keeps each handler's transaction open after its writes.
	HandlerDelay time.Duration
	// FailFirst is the ratio of (message, endpoint) pairs whose first
	// attempt fails.
	FailFirst float64
	// RollbackRatio and RepublishRatio shape the producer's transactions.
	RollbackRatio, RepublishRatio float64
	// KillAfterConfirm is the relay processes' probability, per confirmed
	// batch, of killing themselves between confirm and mark.
	KillAfterConfirm float64

	// Script lists faults injected in order, at least FaultGap apart. With
	// SpreadScript they are spread over the load: fault k of n fires once
	// k+1 n+1ths of the messages committed (so that every fault lands
	// under load however fast the machine is); otherwise they start at once.
	Script       []FaultKind
	SpreadScript bool
	// Random lists the faults drawn at random, FaultGap apart, after the
	// script, for as long as the producer runs.
	Random   []FaultKind
	FaultGap time.Duration

	// LoadTimeout bounds the producer's run; DrainTimeout the wait for
	// everything to be consumed afterwards.
	LoadTimeout, DrainTimeout time.Duration

	// Phases, when set, replace the single producer run: one producer
	// process per phase, in order, each phase's good traffic processed
	// before the next starts (the poison profiles: baseline, poison,
	// baseline). Messages is then their sum.
	Phases []Phase
	// Retries is the consumers' in-process retry count (0: the service's
	// default, 8).
	Retries int
	// Poison bounds the poison phases' verdicts (see CheckPoison).
	Poison PoisonBounds
}

// Phase is one producer run of a phased profile.
type Phase struct {
	Name string
	// Messages is how many good orders the phase commits.
	Messages int
	// PoisonRatio is the share of the phase's producer transactions that
	// send each poison class (workload.PoisonClasses) instead.
	PoisonRatio float64
}

// PoisonProfile is `make reliability PROFILE=poison`: good traffic in
// three phases (baseline, poison, baseline) with 1.5 % of each poison class
// of workload.PoisonClasses mixed into the middle one, no injected fault,
// and the endpoints' default retry policy (3 retries) and concurrency (8). CheckPoison's
// bounds: every poison message terminal within 30 s, good traffic's p99
// during poison at most 2x the baselines' mean, 0 reconnects.
func PoisonProfile() Profile {
	p := ShortProfile()
	p.Name = "poison"
	p.Script, p.Random, p.SpreadScript = nil, nil, false
	p.FailFirst, p.KillAfterConfirm = 0, 0
	p.RollbackRatio, p.RepublishRatio = 0.02, 0.02
	p.Retries = 3
	// The endpoints' default ConcurrentMessageLimit (8), as a service that
	// sets none has it. With 4, at 100/s the five retried classes' backoff
	// (0.7 s each) alone needed about as much handler time as the
	// endpoints had, and the backlog, not poison, set the p99.
	p.Concurrency = 8
	p.Rate = envFloat("BAREWIRE_RELIABILITY_RATE", 100)
	n := envInt("BAREWIRE_RELIABILITY_MESSAGES", 12000)
	p.Phases = []Phase{{Name: "baseline-1", Messages: n / 4}, {Name: "poison", Messages: n / 2, PoisonRatio: 0.015}, {Name: "baseline-2", Messages: n / 4}}
	p.Messages = n/4*2 + n/2
	p.Poison = PoisonBounds{Terminal: 30 * time.Second, P99Ratio: 2}
	p.LoadTimeout = envDuration("BAREWIRE_RELIABILITY_LOAD_TIMEOUT", 10*time.Minute)
	// Long enough for the terminal bound and then some: a poison message
	// still in a queue after it is a failure anyway.
	p.DrainTimeout = 45 * time.Second
	return p
}

// PoisonShortProfile is the poison profile CI runs (TestPoison), sized to
// about 90 s per transport. Its p99 bound is 5x instead of 2x: CI shares
// two cores between the broker, the database and every process, and over
// phases of a dozen seconds one scheduling hiccup moves a p99 more than
// poison does.
func PoisonShortProfile() Profile {
	p := PoisonProfile()
	p.Name = "poison-short"
	p.Rate = envFloat("BAREWIRE_RELIABILITY_RATE", 50)
	n := envInt("BAREWIRE_RELIABILITY_MESSAGES", 2100)
	p.Phases = []Phase{{Name: "baseline-1", Messages: n * 2 / 7}, {Name: "poison", Messages: n * 3 / 7, PoisonRatio: 0.015}, {Name: "baseline-2", Messages: n * 2 / 7}}
	p.Messages = n*2/7*2 + n*3/7
	p.Poison.P99Ratio = 5
	return p
}

// ShortProfile is the profile go test runs (in CI): every fault at least
// once, sized for a small machine to finish within about four minutes.
func ShortProfile() Profile {
	return Profile{
		Name:             "short",
		Messages:         envInt("BAREWIRE_RELIABILITY_MESSAGES", 5000),
		Consumers:        2,
		Relays:           1,
		ProducerWorkers:  4,
		Rate:             envFloat("BAREWIRE_RELIABILITY_RATE", 150),
		Concurrency:      4,
		InboxLockTimeout: 2 * time.Second,
		RelayLease:       3 * time.Second,
		HandlerDelay:     15 * time.Millisecond,
		FailFirst:        0.05,
		RollbackRatio:    0.05,
		RepublishRatio:   0.05,
		KillAfterConfirm: 0.02,
		// broker-close goes last: rabbitmqctl can take many seconds on a
		// loaded machine.
		Script: []FaultKind{
			FaultStopCont, FaultConsumerKill, FaultRelayKill, FaultProducerKill,
			FaultPGRestart, FaultRelayStop, FaultConsumerKill, FaultBrokerClose,
		},
		SpreadScript: true,
		FaultGap:     3 * time.Second,
		LoadTimeout:  envDuration("BAREWIRE_RELIABILITY_LOAD_TIMEOUT", 150*time.Second),
		DrainTimeout: 90 * time.Second,
	}
}

// LongProfile is `make reliability PROFILE=long`: many more messages and a
// random fault every few seconds for as long as the producer runs.
func LongProfile() Profile {
	p := ShortProfile()
	p.Name = "long"
	p.Messages = envInt("BAREWIRE_RELIABILITY_MESSAGES", 200000)
	// About what two consumer processes keep up with on a small shared
	// machine; faster and the queues only grow.
	p.Rate = envFloat("BAREWIRE_RELIABILITY_RATE", 100)
	// Every kind once at the start, then random faults until the end.
	p.Script = []FaultKind{FaultStopCont, FaultConsumerKill, FaultRelayKill, FaultProducerKill, FaultPGRestart, FaultRelayStop, FaultBrokerClose}
	p.SpreadScript = false
	p.Random = []FaultKind{FaultConsumerKill, FaultConsumerKill, FaultRelayKill, FaultBrokerClose, FaultStopCont, FaultProducerKill, FaultRelayStop}
	p.FaultGap = 5 * time.Second
	p.LoadTimeout = envDuration("BAREWIRE_RELIABILITY_LOAD_TIMEOUT", 3*time.Hour)
	p.DrainTimeout = 30 * time.Minute
	return p
}

// ForPostgresTransport adapts p to the PostgreSQL transport:
//
//   - Lease is InboxLockTimeout plus 1s, so that a killed or frozen
//     consumer's message comes back within a few seconds and its
//     redelivery finds the inbox lock already expired (a takeover, not a
//     round of "locked elsewhere" nacks);
//   - no stand-alone relay and no kill-after-confirm: there is no relay
//     traffic (relay-kill stays in the script and is reported as skipped,
//     with the reason);
//   - db-close replaces broker-close;
//   - fewer messages and a lower rate in the short profile, and a lower
//     rate (60/s) in the poison one: every message
//     costs the database the transport's commits on top of the inbox's, on
//     the same (small, shared) machine. BAREWIRE_RELIABILITY_MESSAGES and
//     BAREWIRE_RELIABILITY_RATE still override them.
func ForPostgresTransport(p Profile) Profile {
	p.Transport = TransportPostgres
	p.Lease = p.InboxLockTimeout + time.Second
	p.Relays = 0
	p.KillAfterConfirm = 0
	swap := func(in []FaultKind) []FaultKind {
		out := make([]FaultKind, len(in))
		for i, k := range in {
			if k == FaultBrokerClose {
				k = FaultDBClose
			}
			out[i] = k
		}
		return out
	}
	p.Script, p.Random = swap(p.Script), swap(p.Random)
	if p.Name == "poison" {
		p.Rate = envFloat("BAREWIRE_RELIABILITY_RATE", 60)
	}
	if p.Name == "short" {
		p.Messages = envInt("BAREWIRE_RELIABILITY_MESSAGES", 2000)
		p.Rate = envFloat("BAREWIRE_RELIABILITY_RATE", 60)
	}
	return p
}

// ProfileFromEnv returns the profile BAREWIRE_RELIABILITY_PROFILE names
// ("short", the default, or "long").
func ProfileFromEnv() (Profile, error) {
	switch v := os.Getenv("BAREWIRE_RELIABILITY_PROFILE"); v {
	case "", "short":
		return ShortProfile(), nil
	case "long":
		return LongProfile(), nil
	case "poison", "poison-short":
		return Profile{}, fmt.Errorf("BAREWIRE_RELIABILITY_PROFILE=%q is run by TestPoison and TestPoisonPostgresTransport (make reliability PROFILE=poison)", v)
	default:
		return Profile{}, fmt.Errorf("BAREWIRE_RELIABILITY_PROFILE=%q: use short, long or poison", v)
	}
}

// PoisonProfileFromEnv returns the poison profile TestPoison runs:
// PoisonShortProfile, or PoisonProfile with
// BAREWIRE_RELIABILITY_PROFILE=poison.
func PoisonProfileFromEnv() Profile {
	if os.Getenv("BAREWIRE_RELIABILITY_PROFILE") == "poison" {
		return PoisonProfile()
	}
	return PoisonShortProfile()
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

func envFloat(k string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(k), 64); err == nil && v >= 0 {
		return v
	}
	return def
}

func envDuration(k string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}
