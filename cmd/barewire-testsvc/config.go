package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/barewire-go/barewire/reliability/workload"
)

// Roles a process can play; one process may play several.
const (
	roleProducer = "producer"
	roleConsumer = "consumer"
	roleRelay    = "relay"
)

// Transports the service can run on (-transport).
const (
	transportRabbitMQ = "rabbitmq"
	transportPostgres = "postgres"
)

// config is the service's configuration. Every flag can also be given as
// an environment variable BWTESTSVC_<FLAG> (upper case, '-' as '_'); the
// connection strings additionally read BAREWIRE_AMQP_URL and
// BAREWIRE_POSTGRES_DSN. Prefer the environment for credentials: command
// lines are visible to every user of the machine.
type config struct {
	AMQPURL     string
	PostgresDSN string
	Names       workload.Names
	Roles       []string
	Instance    string
	// Transport is rabbitmq (the default) or postgres. On postgres the
	// endpoints' queues are tables in the PostgreSQL database (prefixed
	// with the run's table prefix), no AMQP URL is needed, and PublishTx
	// writes queue rows in the producer's own transaction.
	Transport string
	// PGLease is the PostgreSQL transport's Lease: how soon the message
	// of a killed or frozen consumer can be claimed again.
	PGLease time.Duration
	// WMRedelivery is a Watermill preset's redelivery timeout (see
	// watermillFactory).
	WMRedelivery time.Duration
	// QueueType is the RabbitMQ transport's Config.QueueType: classic
	// (the default) or quorum (the cluster profile).
	QueueType string

	// Bus and inbox/outbox tuning.
	InboxLockTimeout time.Duration
	RelayLease       time.Duration
	PollingInterval  time.Duration
	Concurrency      int
	Retries          int
	PoolSize         int
	StopTimeout      time.Duration
	// StartTimeout bounds the retries of start-up (tables, bus start)
	// while a dependency is unavailable.
	StartTimeout time.Duration

	// Consumer fault injection.
	HandlerDelay time.Duration
	FailFirst    float64

	// Relay fault injection: the probability, per confirmed batch, that the
	// relay role kills its own process after the broker confirmed the batch
	// and before the outbox rows are marked delivered.
	KillAfterConfirm float64

	// Producer workload.
	Messages        int
	ProducerWorkers int
	RollbackRatio   float64
	RepublishRatio  float64
	Rate            float64
	PayloadBytes    int
	// Phase labels the produced rows (the poison profile's baseline and
	// poison phases); PoisonRatio is the share of transactions sending
	// each poison class (workload.PoisonClasses) instead of an order.
	Phase       string
	PoisonRatio float64

	StatsInterval time.Duration
	LogLevel      string
}

func (c *config) has(role string) bool { return slices.Contains(c.Roles, role) }

// parseConfig reads flags from args, with environment fallbacks.
func parseConfig(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("barewire-testsvc", flag.ContinueOnError)
	var roles string
	fs.StringVar(&c.AMQPURL, "amqp-url", os.Getenv("BAREWIRE_AMQP_URL"), "RabbitMQ URL `amqp://user:password@host:5672/vhost` (prefer the environment variable BAREWIRE_AMQP_URL)")
	fs.StringVar(&c.PostgresDSN, "postgres-dsn", os.Getenv("BAREWIRE_POSTGRES_DSN"), "PostgreSQL DSN (prefer the environment variable BAREWIRE_POSTGRES_DSN)")
	fs.StringVar(&c.Names.Prefix, "table-prefix", "", "table prefix of the inbox, outbox and business tables (required)")
	fs.StringVar(&c.Names.Run, "run", "", "run id: namespaces queues, exchanges and message types (required)")
	fs.StringVar(&roles, "roles", "consumer", "comma-separated roles: producer, consumer, relay")
	fs.StringVar(&c.Instance, "instance", "", "instance name in logs, leases and effect rows (default: host-pid)")
	fs.StringVar(&c.Transport, "transport", transportRabbitMQ, "transport: rabbitmq, postgres (needs no AMQP URL: queues are tables in the PostgreSQL database), or a Watermill preset: wmamqp, wmnats (BAREWIRE_NATS_URL), wmredis (BAREWIRE_REDIS_ADDR)")
	fs.DurationVar(&c.PGLease, "pg-lease", 0, "postgres transport: Lease, how soon a killed or frozen consumer's message is claimed again (0: -inbox-lock-timeout plus 1s, so that the redelivery finds the inbox lock expired and takes it over)")
	fs.DurationVar(&c.WMRedelivery, "wm-redelivery", 5*time.Second, "wmnats, wmredis: how long an unacknowledged message waits before it is delivered again (JetStream AckWait, Redis MaxIdleTime)")
	fs.StringVar(&c.QueueType, "queue-type", "classic", "rabbitmq transport: type of the endpoint and error queues, classic or quorum (rabbitmq.Config.QueueType)")
	fs.DurationVar(&c.InboxLockTimeout, "inbox-lock-timeout", 3*time.Second, "InboxLockTimeout")
	fs.DurationVar(&c.RelayLease, "relay-lease", 3*time.Second, "outbox RelayLease")
	fs.DurationVar(&c.PollingInterval, "polling-interval", time.Second, "outbox PollingInterval")
	fs.IntVar(&c.Concurrency, "concurrency", 4, "ConcurrentMessageLimit of each endpoint")
	fs.IntVar(&c.Retries, "retries", 8, "in-process retries per message (exponential, 100ms to 2s) before dead-lettering")
	fs.IntVar(&c.PoolSize, "pool-size", 12, "PostgreSQL connection pool size")
	fs.DurationVar(&c.StopTimeout, "stop-timeout", 10*time.Second, "graceful stop timeout")
	fs.DurationVar(&c.StartTimeout, "start-timeout", 30*time.Second, "how long start-up retries an unavailable database or broker")
	fs.DurationVar(&c.HandlerDelay, "handler-delay", 0, "time each consumer spends after its writes, before returning (so kills land mid-handler)")
	fs.Float64Var(&c.FailFirst, "fail-first", 0, "ratio of messages whose first attempt fails on each endpoint, 0-1")
	fs.Float64Var(&c.KillAfterConfirm, "kill-after-confirm", 0, "relay role: probability per confirmed batch of SIGKILLing this process before marking the rows, 0-1")
	fs.IntVar(&c.Messages, "messages", 1000, "producer role: committed messages to reach (counted in the produced table, across processes and restarts)")
	fs.IntVar(&c.ProducerWorkers, "producer-workers", 4, "producer role: concurrent producer transactions")
	fs.Float64Var(&c.RollbackRatio, "rollback-ratio", 0.05, "producer role: ratio of transactions rolled back after publishing")
	fs.Float64Var(&c.RepublishRatio, "republish-ratio", 0.05, "producer role: ratio of transactions re-publishing an already committed message id")
	fs.Float64Var(&c.Rate, "rate", 0, "producer role: transactions per second (0: as fast as possible)")
	fs.IntVar(&c.PayloadBytes, "payload-bytes", 64, "producer role: padding added to each order")
	fs.StringVar(&c.Phase, "phase", "", "producer role: label written with each produced row (the poison profile's phases)")
	fs.Float64Var(&c.PoisonRatio, "poison-ratio", 0, "producer role: ratio of transactions sending each poison class instead of an order, 0-1 (the poison profile)")
	fs.DurationVar(&c.StatsInterval, "stats-interval", 500*time.Millisecond, "how often to log counters")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := applyEnv(fs); err != nil {
		return nil, err
	}
	for r := range strings.SplitSeq(roles, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		switch r {
		case roleProducer, roleConsumer, roleRelay:
			if !c.has(r) {
				c.Roles = append(c.Roles, r)
			}
		default:
			return nil, fmt.Errorf("unknown role %q: use producer, consumer or relay", r)
		}
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Transport == "" { // BWTESTSVC_TRANSPORT set but empty
		c.Transport = transportRabbitMQ
	}
	if c.PGLease == 0 && c.InboxLockTimeout > 0 {
		c.PGLease = c.InboxLockTimeout + time.Second
	}
	return c, c.validate()
}

// applyEnv sets every flag not given on the command line from
// BWTESTSVC_<NAME>, when that variable is set.
func applyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		key := "BWTESTSVC_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(key); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", key, err))
			}
		}
	})
	return errors.Join(errs...)
}

func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch c.Transport {
	case transportRabbitMQ:
		if c.AMQPURL == "" {
			bad("no RabbitMQ URL: set BAREWIRE_AMQP_URL or -amqp-url (or choose -transport postgres)")
		}
		if c.QueueType != "classic" && c.QueueType != "quorum" {
			bad("-queue-type %q: use classic or quorum", c.QueueType)
		}
	case transportPostgres:
		// The lease is extended every third of itself while a handler
		// runs; below 100ms the transport refuses it.
		if c.PGLease < 100*time.Millisecond {
			bad("-pg-lease %v: use at least 100ms", c.PGLease)
		}
	default:
		if isWatermill(c.Transport) {
			c.validateWatermill(bad)
			break
		}
		bad("-transport %q: use rabbitmq, postgres, wmamqp, wmnats or wmredis", c.Transport)
	}
	if c.PostgresDSN == "" {
		bad("no PostgreSQL DSN: set BAREWIRE_POSTGRES_DSN or -postgres-dsn")
	}
	if c.Names.Run == "" || c.Names.Prefix == "" {
		bad("-run and -table-prefix are required")
	} else if err := c.Names.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(c.Roles) == 0 {
		bad("no roles: give -roles producer,consumer,relay (any of them)")
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"fail-first", c.FailFirst}, {"kill-after-confirm", c.KillAfterConfirm}, {"rollback-ratio", c.RollbackRatio}, {"republish-ratio", c.RepublishRatio}, {"poison-ratio", c.PoisonRatio}} {
		if r.v < 0 || r.v > 1 {
			bad("-%s %v must be within [0, 1]", r.name, r.v)
		}
	}
	if c.RollbackRatio+c.RepublishRatio >= 1 {
		bad("-rollback-ratio plus -republish-ratio must stay below 1")
	}
	if n := len(workload.PoisonClasses(c.Transport)); c.PoisonRatio*float64(n) >= 0.5 {
		bad("-poison-ratio %v times %d classes must stay below 0.5", c.PoisonRatio, n)
	}
	if c.Concurrency < 1 || c.ProducerWorkers < 1 || c.PoolSize < 2 || c.Retries < 0 || c.Messages < 0 || c.PayloadBytes < 0 {
		bad("-concurrency, -producer-workers must be >= 1, -pool-size >= 2, -retries, -messages, -payload-bytes >= 0")
	}
	if c.InboxLockTimeout <= 0 || c.RelayLease <= 0 || c.StatsInterval <= 0 || c.StopTimeout <= 0 || c.StartTimeout <= 0 {
		bad("-inbox-lock-timeout, -relay-lease, -stats-interval, -stop-timeout and -start-timeout must be positive")
	}
	return errors.Join(errs...)
}

// passwordRE finds the password of a key=value PostgreSQL DSN, quoted or not.
var passwordRE = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]+)`)

// redactDSN hides the password of a PostgreSQL DSN in either form
// (postgres:// URL or key=value pairs).
func redactDSN(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "postgres://xxxxx (unparsable DSN)"
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return passwordRE.ReplaceAllString(dsn, "${1}xxxxx")
}

// redactURL hides the password of an AMQP URL.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "amqp://xxxxx (unparsable URL)"
	}
	return u.Redacted()
}

// withApplicationName returns dsn with application_name set to name (it
// replaces any application_name the DSN had), in either DSN form. The
// harness finds the process's sessions in pg_stat_activity by that name.
func withApplicationName(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("cannot parse the PostgreSQL DSN as a URL") // never quote it: it may hold a password
		}
		q := u.Query()
		q.Set("application_name", name)
		// Encode writes a space as '+', which pgx reads literally; a '+'
		// of the values themselves is already %2B.
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String(), nil
	}
	// key=value form: a later key wins, so appending overrides.
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(name)
	return strings.TrimSpace(dsn) + " application_name='" + quoted + "'", nil
}
