//go:build linux

package reliability

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/tcpproxy"
	"github.com/barewire-go/barewire/reliability/workload"
)

// ServicePackage is the import path of the test service.
const ServicePackage = "github.com/barewire-go/barewire/cmd/barewire-testsvc"

// BuildService builds the test service into dir and returns the binary's
// path. It is built without -race: the processes are the system under
// test, not the harness, and the race detector would slow them several
// times over.
func BuildService(ctx context.Context, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		root := os.Getenv("GOROOT")
		if root == "" {
			return "", fmt.Errorf("reliability: no go command on PATH to build %s", ServicePackage)
		}
		goBin = filepath.Join(root, "bin", "go")
	}
	out := filepath.Join(dir, "barewire-testsvc")
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, ServicePackage)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", ServicePackage, err, b)
	}
	return out, nil
}

// Env is where a run happens. The transport is the profile's
// (Profile.Transport): on the PostgreSQL transport AMQPURL and Broker are
// not used and may be empty.
type Env struct {
	PostgresDSN string
	// AMQPURL is the broker's URL (RabbitMQ transport only).
	AMQPURL string
	// Bin is the service binary (BuildService).
	Bin string
	// LogDir receives one log file per process incarnation.
	LogDir string
	// Broker drives the broker (RabbitMQ transport only); its Ctl may be
	// empty (broker-close then cuts the connections at the proxy instead).
	Broker *Broker
	// PGRestart is the command that restarts PostgreSQL; empty skips the
	// pg-restart fault.
	PGRestart []string
	// Logf reports progress.
	Logf func(format string, args ...any)
	// Keep keeps the run's tables and queues even when the run passed.
	Keep bool
	// NATSURL and RedisAddr are the servers of the wmnats and wmredis
	// presets (see ForWatermill).
	NATSURL, RedisAddr string
	// Cluster, when set, runs the RabbitMQ transport on a cluster (see
	// ForCluster): AMQPURL lists its nodes, the node faults act on it, and
	// queue depths are read from a running node.
	Cluster *Cluster
}

// Result is the outcome of a run.
type Result struct {
	Profile Profile
	Names   workload.Names
	// Elapsed is the whole run; Load the producer's part; Drain the wait
	// for everything to be consumed afterwards.
	Elapsed, Load, Drain time.Duration
	// Faults counts injected faults by kind; Skipped says why a kind in
	// the profile could not be injected.
	Faults  map[FaultKind]int
	Skipped map[FaultKind]string
	// FaultLog lists every fault with its details, in order.
	FaultLog []string
	// MidHandlerKills counts consumer kills that found handlers in flight
	// at the process's last report.
	MidHandlerKills int
	Procs           []ProcStats
	Report          *Report
	// DeadLetters and Leftover are message counts of the error queues and
	// of the endpoint queues after every process stopped.
	DeadLetters, Leftover map[string]int
	Drained               bool
	LastProgress          Progress
	// Problems are failures of the harness or the processes (not of the
	// checker), such as a process that could not be restarted.
	Problems []string
	// Notes are observations that are not failures.
	Notes []string
	// Poison is the poison checker's report (phased profiles only).
	Poison *PoisonReport
	// Cluster reports each node fault (cluster runs only).
	Cluster *ClusterReport
	// PhaseLog says when each phase ran (phased profiles).
	PhaseLog []string
}

// NewNames returns fresh names for a run.
func NewNames() workload.Names {
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	s := hex.EncodeToString(raw[:])
	return workload.Names{Run: "rel-" + s, Prefix: "rel_" + s + "_"}
}

// run is one run in progress.
type run struct {
	env   Env
	prof  Profile
	names workload.Names
	db    *gorm.DB
	res   *Result
	// queues are the transport's queues: the broker's, or the PostgreSQL
	// transport's tables.
	queues queueOps

	mu        sync.Mutex
	consumers []*Proc
	proxies   []*tcpproxy.Proxy // proxies[i] carries consumers[i]'s broker connections
	relays    []*Proc
	producer  *Proc
	// phaseProducers are the producers of a phased profile, one per phase.
	phaseProducers []*Proc
}

// Run runs prof: it starts the processes, drives the workload, injects the
// faults, waits for everything to drain, stops the processes and runs the
// checker. The error reports a harness failure; the run's verdict is in
// Result.Failures.
func Run(ctx context.Context, env Env, prof Profile) (*Result, error) {
	if env.Logf == nil {
		env.Logf = func(string, ...any) {}
	}
	switch prof.Transport {
	case "":
		prof.Transport = TransportRabbitMQ
	case TransportRabbitMQ, TransportPostgres:
	case TransportWMAMQP, TransportWMNATS, TransportWMRedis:
		if err := env.checkWatermillEnv(prof.Transport); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("reliability: transport %q: use %q or %q", prof.Transport, TransportRabbitMQ, TransportPostgres)
	}
	if prof.Transport == TransportRabbitMQ && (env.AMQPURL == "" || env.Broker == nil) {
		return nil, errors.New("reliability: the RabbitMQ transport needs Env.AMQPURL and Env.Broker")
	}
	if prof.Transport == TransportPostgres && prof.Lease <= 0 {
		return nil, errors.New("reliability: the PostgreSQL transport needs Profile.Lease (see ForPostgresTransport)")
	}
	r := &run{env: env, prof: prof, names: NewNames()}
	r.res = &Result{Profile: prof, Names: r.names, Faults: map[FaultKind]int{}, Skipped: map[FaultKind]string{}}
	start := time.Now()
	db, err := postgresdb.Open(env.PostgresDSN)
	if err != nil {
		return nil, err
	}
	r.db = db
	defer closeDB(db)
	r.queues = env.Broker
	if env.Cluster != nil {
		r.queues = env.Cluster
	}
	switch prof.Transport {
	case TransportPostgres:
		r.queues = &pgQueues{db: db, names: r.names}
	case TransportWMNATS:
		r.queues = &natsQueues{url: env.NATSURL, names: r.names}
	case TransportWMRedis:
		r.queues = &redisQueues{addr: env.RedisAddr, names: r.names}
	}
	// Create every table before any process starts, so that the processes
	// find them and skip their own migration (see the service's migrate).
	st, err := gormstore.New(db, gormstore.WithTablePrefix(r.names.Prefix))
	if err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		return nil, err
	}
	if err := workload.Migrate(ctx, db, r.names); err != nil {
		return nil, err
	}
	if prof.Transport == TransportPostgres {
		if err := workload.MigrateTransport(ctx, db, r.names); err != nil {
			return nil, err
		}
	}
	env.Logf("run %s: tables %s*, %d messages, profile %s, transport %s", r.names.Run, r.names.Prefix, prof.Messages, prof.Name, prof.Transport)

	err = r.execute(ctx)
	r.stopAll()
	for _, px := range r.proxies {
		if px != nil {
			px.Close()
		}
	}
	r.res.Elapsed = time.Since(start)
	for _, p := range r.all() {
		r.res.Procs = append(r.res.Procs, p.Stats())
		if err := p.Err(); err != nil {
			r.res.Problems = append(r.res.Problems, err.Error())
		}
	}
	if err != nil {
		return r.res, err
	}
	if err := r.collect(ctx); err != nil {
		return r.res, err
	}
	if len(r.res.Failures()) == 0 && !env.Keep {
		r.cleanup()
	} else {
		env.Logf("kept tables %s* and queues %s-* (transport %s) for inspection; logs in %s", r.names.Prefix, r.names.Run, prof.Transport, env.LogDir)
	}
	return r.res, nil
}

func closeDB(db *gorm.DB) { _ = gormstore.Close(db) }

// baseArgs are the arguments every process gets.
func (r *run) baseArgs(name string, roles ...string) []string {
	p := r.prof
	args := []string{
		"-run", r.names.Run, "-table-prefix", r.names.Prefix,
		"-roles", strings.Join(roles, ","), "-instance", name,
		"-transport", p.Transport,
		"-inbox-lock-timeout", p.InboxLockTimeout.String(), "-relay-lease", p.RelayLease.String(),
		"-handler-delay", p.HandlerDelay.String(), "-fail-first", fmt.Sprint(p.FailFirst),
		"-concurrency", strconv.Itoa(p.Concurrency),
	}
	if p.Retries > 0 {
		args = append(args, "-retries", strconv.Itoa(p.Retries))
	}
	if p.Redelivery > 0 {
		args = append(args, "-wm-redelivery", p.Redelivery.String())
	}
	if p.QueueType != "" {
		args = append(args, "-queue-type", p.QueueType)
	}
	if p.Transport == TransportPostgres {
		// Each handler holds a pooled connection for its transaction, and
		// the transport needs one more for LISTEN and one per claim, ack
		// or lease extension in flight: the default pool (12) equals the
		// handler count (3 endpoints × 4).
		args = append(args, "-pg-lease", p.Lease.String(), "-pool-size", strconv.Itoa(3*p.Concurrency+4))
	}
	return args
}

// credentials go through the environment, never the command line.
func (r *run) credentials() []string {
	env := []string{"BAREWIRE_POSTGRES_DSN=" + r.env.PostgresDSN}
	if r.prof.Transport == TransportRabbitMQ {
		env = append(env, "BAREWIRE_AMQP_URL="+r.env.AMQPURL)
	}
	wm, _ := r.env.watermillEnv(r.prof.Transport, nil)
	return append(env, wm...)
}

func (r *run) start(name string, args []string, env ...string) (*Proc, error) {
	return StartProc(r.env.Bin, r.env.LogDir, ProcSpec{Name: name, Args: args, Env: append(r.credentials(), env...)})
}

// brokerHostPort is the broker's host:port from the AMQP URL.
func brokerHostPort(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("reliability: cannot parse the AMQP URL")
	}
	host := u.Host
	if u.Port() == "" {
		port := "5672"
		if u.Scheme == "amqps" {
			port = "5671"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	return host, nil
}

func (r *run) execute(ctx context.Context) error {
	p := r.prof
	// Consumers first: they declare the queues and bindings, without
	// which the first orders would be routed nowhere.
	// On RabbitMQ each consumer reaches the broker through a proxy of its
	// own, which can cut its connections even while it is frozen
	// (stop-cont). The PostgreSQL transport needs none (see stopCont).
	for i := range p.Consumers {
		name := fmt.Sprintf("consumer-%d", i+1)
		var extraEnv []string
		var px *tcpproxy.Proxy
		if (p.Transport == TransportRabbitMQ && r.env.Cluster == nil) || IsWatermill(p.Transport) { // a cluster's faults are its nodes'
			target, err := r.env.serverHostPort(p.Transport)
			if err != nil {
				return err
			}
			if px, err = tcpproxy.New(target); err != nil {
				return err
			}
			// Later entries win in os/exec: these replace the direct
			// addresses.
			if IsWatermill(p.Transport) {
				extraEnv, err = r.env.watermillEnv(p.Transport, px)
			} else {
				var proxied string
				proxied, err = proxiedURL(px, r.env.AMQPURL)
				extraEnv = append(extraEnv, "BAREWIRE_AMQP_URL="+proxied)
			}
			if err != nil {
				px.Close()
				return err
			}
		}
		r.proxies = append(r.proxies, px)
		proc, err := r.start(name, r.baseArgs(name, "consumer"), extraEnv...)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.consumers = append(r.consumers, proc)
		r.mu.Unlock()
	}
	for i := range p.Relays {
		name := fmt.Sprintf("relay-%d", i+1)
		args := append(r.baseArgs(name, "relay"), "-kill-after-confirm", fmt.Sprint(p.KillAfterConfirm))
		proc, err := r.start(name, args)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.relays = append(r.relays, proc)
		r.mu.Unlock()
	}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, proc := range r.all() {
		if err := proc.WaitReady(readyCtx); err != nil {
			return err
		}
	}
	if len(p.Phases) > 0 {
		return r.runPhases(ctx)
	}
	args := append(r.baseArgs("producer", "producer"),
		"-messages", strconv.Itoa(p.Messages), "-producer-workers", strconv.Itoa(p.ProducerWorkers),
		"-rate", fmt.Sprint(p.Rate), "-rollback-ratio", fmt.Sprint(p.RollbackRatio),
		"-republish-ratio", fmt.Sprint(p.RepublishRatio))
	prod, err := r.start("producer", args)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.producer = prod
	r.mu.Unlock()
	loadStart := time.Now()
	r.env.Logf("processes ready; producing")

	// Faults run alongside the load.
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	var faults sync.WaitGroup
	faults.Go(func() { r.injectFaults(faultCtx, prod.Done()) })

	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	loadTimeout := time.NewTimer(p.LoadTimeout)
	defer loadTimeout.Stop()
wait:
	for {
		select {
		case <-prod.Done():
			break wait
		case <-progress.C:
			if pr, err := ReadProgress(ctx, r.db, r.names); err == nil {
				r.env.Logf("load %s: %s", time.Since(loadStart).Round(time.Second), pr)
			}
		case <-loadTimeout.C:
			// Not a failure of any guarantee: the machine is slower than
			// the profile assumed. Stop producing and check what committed.
			r.res.Notes = append(r.res.Notes, fmt.Sprintf("the producer was stopped at the load timeout (%v) before reaching %d messages", p.LoadTimeout, p.Messages))
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := prod.Stop(stopCtx)
			cancel()
			if err != nil {
				r.res.Problems = append(r.res.Problems, err.Error())
			}
			break wait
		case <-ctx.Done():
			stopFaults()
			faults.Wait()
			return ctx.Err()
		}
	}
	if err := prod.Err(); err != nil {
		r.res.Problems = append(r.res.Problems, err.Error())
	}
	r.res.Load = time.Since(loadStart)
	// The script runs to its end even when the producer is done first.
	faults.Wait()
	r.env.Logf("load done in %s; draining", r.res.Load.Round(time.Millisecond))
	drainStart := time.Now()
	r.drain(ctx)
	r.res.Drain = time.Since(drainStart)
	return nil
}

func (r *run) all() []*Proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]*Proc{}, r.consumers...)
	out = append(out, r.relays...)
	if r.producer != nil {
		out = append(out, r.producer)
	}
	return append(out, r.phaseProducers...)
}

// drain waits until every committed id has all its effects, nothing is
// pending in the outbox or locked in the inbox, and the run's queues are
// empty (including unacknowledged messages) on two checks in a row. The
// database and the broker offer no event for this, so it polls.
func (r *run) drain(ctx context.Context) {
	deadline := time.Now().Add(r.prof.DrainTimeout)
	stable := 0
	lastLog := time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		pr, err := ReadProgress(ctx, r.db, r.names)
		if err == nil {
			r.res.LastProgress = pr
		}
		if err == nil && pr.Complete() {
			depths, err := r.queues.QueueDepths(ctx, r.names.Queues())
			empty := err == nil
			for _, n := range depths {
				empty = empty && n == 0
			}
			if empty {
				stable++
			} else {
				stable = 0
			}
			if stable >= 2 {
				r.res.Drained = true
				return
			}
		} else {
			stable = 0
		}
		if time.Since(lastLog) > 10*time.Second {
			r.env.Logf("draining: %s", pr)
			lastLog = time.Now()
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
}

// stopAll stops every process gracefully, in parallel.
func (r *run) stopAll() {
	var wg sync.WaitGroup
	for _, p := range r.all() {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.Stop(ctx); err != nil {
				r.mu.Lock()
				r.res.Problems = append(r.res.Problems, err.Error())
				r.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// collect runs the checker and reads the broker's final counts.
func (r *run) collect(ctx context.Context) error {
	rep, err := Check(ctx, r.db, r.names)
	if err != nil {
		return err
	}
	rep.DirectDelivery = r.prof.Transport == TransportPostgres
	r.res.Report = rep
	var errQueues []string
	for _, q := range r.names.Queues() {
		errQueues = append(errQueues, q+"_error")
	}
	if r.res.DeadLetters, err = r.queues.QueueDepths(ctx, errQueues); err != nil {
		return err
	}
	if r.res.Leftover, err = r.queues.QueueDepths(ctx, r.names.Queues()); err != nil {
		return err
	}
	if len(r.prof.Phases) > 0 {
		if r.res.Poison, err = r.checkPoison(ctx); err != nil {
			return err
		}
	}
	if r.env.Cluster != nil {
		if r.res.Cluster, err = r.clusterReport(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := workload.Drop(ctx, r.db, r.names); err != nil {
		r.env.Logf("cleanup: %v", err)
	}
	if err := r.queues.DeleteTopology(r.names.Queues(), r.names.Exchanges()); err != nil {
		r.env.Logf("cleanup: %v", err)
	}
}

// injectFaults runs the profile's script (see Profile.Script), then random
// faults until loadDone is closed.
func (r *run) injectFaults(ctx context.Context, loadDone <-chan struct{}) {
	gap := r.prof.FaultGap
	last := time.Now()
	n := 0
	for k, kind := range r.prof.Script {
		if r.prof.SpreadScript {
			threshold := int64(r.prof.Messages) * int64(k+1) / int64(len(r.prof.Script)+1)
			if !r.waitCommitted(ctx, threshold, loadDone) {
				return
			}
		}
		if !sleepCtx(ctx, time.Until(last.Add(gap))) && ctx.Err() != nil {
			return
		}
		r.inject(ctx, kind, n)
		last = time.Now()
		n++
	}
	if len(r.prof.Random) == 0 {
		return
	}
	for {
		select {
		case <-loadDone:
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Until(last.Add(gap))):
		}
		r.inject(ctx, r.prof.Random[mrand.IntN(len(r.prof.Random))], n)
		last = time.Now()
		n++
	}
}

// waitCommitted polls the produced table until it holds n rows, the load
// is done or ctx ends; it reports false only when ctx ended.
func (r *run) waitCommitted(ctx context.Context, n int64, loadDone <-chan struct{}) bool {
	for {
		var have int64
		if err := r.db.WithContext(ctx).Raw(`SELECT count(*) FROM ` + r.names.Table(workload.TableProduced)).Scan(&have).Error; err == nil && have >= n {
			return true
		}
		select {
		case <-loadDone:
			return true
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// inject injects one fault; n picks the target among the consumers.
func (r *run) inject(ctx context.Context, kind FaultKind, n int) {
	start := time.Now()
	detail, err := r.injectOne(ctx, kind, n)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case errors.Is(err, errSkipped):
		if _, seen := r.res.Skipped[kind]; !seen {
			r.res.Skipped[kind] = detail
		}
		r.env.Logf("fault %s skipped: %s", kind, detail)
	case err != nil:
		r.res.Problems = append(r.res.Problems, fmt.Sprintf("fault %s: %v", kind, err))
		r.env.Logf("fault %s failed: %v", kind, err)
	default:
		r.res.Faults[kind]++
		line := fmt.Sprintf("%s %s (%s)", kind, detail, time.Since(start).Round(time.Millisecond))
		r.res.FaultLog = append(r.res.FaultLog, line)
		r.env.Logf("fault %s", line)
	}
}

// errSkipped marks a fault that this environment cannot inject.
var errSkipped = errors.New("skipped")

func (r *run) injectOne(ctx context.Context, kind FaultKind, n int) (string, error) {
	r.mu.Lock()
	consumers := r.consumers
	target := consumers[n%len(consumers)]
	proxy := r.proxies[n%len(consumers)]
	var relay *Proc
	if len(r.relays) > 0 {
		relay = r.relays[n%len(r.relays)]
	}
	producer := r.producer
	pgRestarted := r.res.Faults[FaultPGRestart] > 0
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if kind == FaultNodeKill || kind == FaultNodeStop {
		return r.nodeFault(ctx, kind, n)
	}

	switch kind {
	case FaultConsumerKill:
		inFlight := target.LastCounter("in_flight")
		if inFlight > 0 {
			r.mu.Lock()
			r.res.MidHandlerKills++
			r.mu.Unlock()
		}
		if err := target.Kill(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s, %d handlers in flight at its last report, restarted", target.Name(), inFlight), nil

	case FaultRelayKill:
		if r.prof.Transport == TransportPostgres {
			return "no relay traffic on the PostgreSQL transport: PublishTx and the consumers' publishes write their queue rows in their own transaction (the checker verifies the outbox stays empty), so no stand-alone relay runs and killing one would test nothing", errSkipped
		}
		if relay == nil {
			return "no stand-alone relay in this profile", errSkipped
		}
		if err := relay.Kill(ctx); err != nil {
			return "", err
		}
		return relay.Name() + " restarted", nil

	case FaultRelayStop:
		if r.prof.Transport == TransportPostgres {
			return "no relay traffic on the PostgreSQL transport (see relay-kill)", errSkipped
		}
		if relay == nil {
			return "no stand-alone relay in this profile", errSkipped
		}
		return r.relayStop(ctx, relay)

	case FaultProducerKill:
		select {
		case <-producer.Done():
			return "the producer had already finished", errSkipped
		default:
		}
		if err := producer.Kill(ctx); err != nil {
			return "", err
		}
		return "restarted", nil

	case FaultBrokerClose:
		if r.prof.Transport == TransportPostgres {
			return "no broker on the PostgreSQL transport; db-close is its equivalent", errSkipped
		}
		if IsWatermill(r.prof.Transport) {
			return fmt.Sprintf("%s, %d connections cut at the proxy", target.Name(), proxy.Cut()), nil
		}
		if len(r.env.Broker.Ctl) == 0 {
			// Without rabbitmqctl, cut the TCP connections instead.
			return fmt.Sprintf("%s, %d connections cut at the proxy (no rabbitmqctl)", target.Name(), proxy.Cut()), nil
		}
		closed, err := r.env.Broker.CloseConnections(ctx, target.Pid(), "reliability fault: broker-close")
		if err != nil {
			// rabbitmqctl can time out on a loaded machine: cut instead.
			return fmt.Sprintf("%s, %d connections cut at the proxy (rabbitmqctl failed: %v)", target.Name(), proxy.Cut(), err), nil
		}
		return fmt.Sprintf("%s, %d connections closed by the broker", target.Name(), closed), nil

	case FaultStopCont:
		if len(consumers) < 2 {
			return "needs two consumer processes", errSkipped
		}
		return r.stopCont(ctx, target, proxy)

	case FaultDBClose:
		appName := workload.ApplicationName(r.names.Run, target.Name(), target.Pid())
		n, err := terminateSessions(ctx, r.db, appName)
		if err != nil {
			return "", err
		}
		if n == 0 {
			// Every consumer holds at least its pool's idle connections
			// (and, on the PostgreSQL transport, its LISTEN session).
			return "", fmt.Errorf("%s: no database session with application_name %q to terminate", target.Name(), appName)
		}
		return fmt.Sprintf("%s, %d database sessions terminated", target.Name(), n), nil

	case FaultPGRestart:
		if len(r.env.PGRestart) == 0 {
			return "not enabled: it would break other packages' tests running at the same time (make reliability enables it; or set BAREWIRE_RELIABILITY_PG_RESTART=1 or BAREWIRE_TEST_PG_RESTART_CMD)", errSkipped
		}
		if pgRestarted {
			return "PostgreSQL is restarted at most once per run", errSkipped
		}
		cmd := exec.CommandContext(ctx, r.env.PGRestart[0], r.env.PGRestart[1:]...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("%s: %w\n%s", strings.Join(r.env.PGRestart, " "), err, out)
		}
		return "restarted", nil
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

// stopCont freezes target longer than InboxLockTimeout. As it freezes, its
// broker connections are cut at the proxy, so the broker redelivers its
// unacknowledged messages to the other consumers, which take over the
// expired inbox locks and commit. Then target resumes: its handlers finish
// and try to commit with lock tokens that no longer hold; the inbox must
// refuse (the checker then proves the effect happened once).
//
// On the PostgreSQL transport (proxy nil) nothing is cut: the frozen
// process stops extending the leases of its claimed rows, so once Lease
// has passed the other consumer claims them, and the freeze lasts past
// both Lease and InboxLockTimeout. Cutting its database sessions instead
// (pg_terminate_backend, or at a proxy) would be unsound here: the server
// would roll back the frozen handlers' open transactions, so no late
// commit would ever reach the inbox and its fencing would go untested.
//
// The freeze lasts until the inbox shows that another consumer took over
// and committed at least one of the entries locked when the freeze began
// (or until a deadline): resuming earlier would let the frozen handlers
// commit first, and nothing would be fenced.
func (r *run) stopCont(ctx context.Context, target *Proc, proxy *tcpproxy.Proxy) (string, error) {
	inFlight := target.LastCounter("in_flight")
	fencedBefore := target.Stats().Fenced
	var (
		inc    *incarnation
		caught = "" // how the moment of the freeze was chosen
		err    error
	)
	if proxy == nil {
		var mid bool
		var tries int
		if inc, mid, tries, err = r.freezeMidHandler(ctx, target); err != nil {
			return "", err
		}
		if mid {
			caught = fmt.Sprintf(", caught with a handler's transaction open (try %d)", tries)
		} else {
			caught = fmt.Sprintf(", no handler caught with its transaction open in %d tries", tries)
			r.mu.Lock()
			r.res.Notes = append(r.res.Notes, "stop-cont: "+target.Name()+" was frozen without a handler mid-transaction (the freeze tested a long pause and the lease, not fencing)")
			r.mu.Unlock()
		}
	} else if inc, err = target.Signal(syscall.SIGSTOP); err != nil {
		return "", err
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = inc.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	if err := waitStopped(ctx, inc.cmd.Process.Pid); err != nil {
		return "", err
	}
	// Entries locked now are mostly the frozen process's; the live ones
	// finish as usual (without a new attempt).
	type entry struct {
		MessageID, ConsumerType string
		Attempts                int
	}
	var locked []entry
	inboxT := r.names.Table("inbox")
	if err := r.db.WithContext(ctx).Raw(`SELECT message_id, consumer_type, attempts FROM ` + inboxT +
		` WHERE processed_at IS NULL AND lock_token IS NOT NULL`).Scan(&locked).Error; err != nil {
		return "", err
	}
	how := "lease left to run out"
	if proxy != nil {
		how = fmt.Sprintf("%d connections cut", proxy.Cut())
	}
	start := time.Now()
	// No takeover can happen sooner: the inbox lock must expire, and on
	// the PostgreSQL transport the lease of the frozen process's claim.
	minFreeze := r.prof.InboxLockTimeout
	if proxy == nil {
		minFreeze = max(minFreeze, r.prof.Lease)
	}
	sleepCtx(ctx, minFreeze)
	takenOver := 0
	deadline := start.Add(minFreeze + 30*time.Second)
	for takenOver == 0 && len(locked) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		for _, e := range locked {
			var n int64
			if err := r.db.WithContext(ctx).Raw(`SELECT count(*) FROM `+inboxT+` WHERE message_id = ? AND consumer_type = ? AND processed_at IS NOT NULL AND attempts > ?`,
				e.MessageID, e.ConsumerType, e.Attempts).Scan(&n).Error; err == nil && n > 0 {
				takenOver++
			}
		}
		if takenOver == 0 {
			sleepCtx(ctx, 200*time.Millisecond)
		}
	}
	frozen := time.Since(start)
	resumed = true
	if err := inc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return "", err
	}
	// Wait (polling its log counters: there is no other signal) for the
	// resumed handlers to report refused commits.
	if takenOver > 0 {
		deadline := time.Now().Add(10 * time.Second)
		for target.Stats().Fenced == fencedBefore && time.Now().Before(deadline) && sleepCtx(ctx, 100*time.Millisecond) {
		}
	}
	fenced := target.Stats().Fenced - fencedBefore
	return fmt.Sprintf("%s frozen %s with %d handlers in flight at its last report%s, %s, %d of %d locked inbox entries taken over by others; %d late commits refused",
		target.Name(), frozen.Round(time.Millisecond), inFlight, caught, how, takenOver, len(locked), fenced), nil
}

// relayStop freezes the stand-alone relay while it holds a batch: one of
// its sessions (found by application_name) is idle in the transaction of
// its claim (the claim statement, FOR UPDATE SKIP LOCKED, was its last),
// which is while the batch is published and its confirms awaited. It
// polls pg_stat_activity for that moment, stops the process, and re-reads
// it: a batch settled before the stop took effect means resuming and
// trying again (20s at most, then it freezes the relay as it is). Frozen,
// it waits until PostgreSQL has ended every such transaction of the relay
// (RelayLease is their idle_in_transaction_session_timeout) and then one
// second more, so that other relays claim the rows first, and resumes it.
func (r *run) relayStop(ctx context.Context, relay *Proc) (string, error) {
	const q = `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = ? AND state = 'idle in transaction'
    AND position('SKIP LOCKED' in query) > 0 AND position(? in query) > 0`
	// The relay may die by itself at any moment (kill-after-confirm) and
	// come back under another pid, so another application_name: held
	// looks for the sessions of the incarnation it is given.
	held := func(inc *incarnation) (int, error) {
		var n int
		appName := workload.ApplicationName(r.names.Run, relay.Name(), inc.cmd.Process.Pid)
		err := r.db.WithContext(ctx).Raw(q, appName, r.names.Prefix+"outbox").Scan(&n).Error
		return n, err
	}
	deadline := time.Now().Add(20 * time.Second)
	var inc *incarnation
	var n, tries int
	for {
		busy, err := held(relay.current())
		if err != nil {
			return "", err
		}
		last := time.Now().After(deadline)
		if busy == 0 && !last {
			if !sleepCtx(ctx, 2*time.Millisecond) {
				return "", ctx.Err()
			}
			continue
		}
		tries++
		inc, err = relay.Signal(syscall.SIGSTOP)
		if err == nil {
			err = waitStopped(ctx, inc.cmd.Process.Pid)
		}
		if errors.Is(err, os.ErrProcessDone) || errors.Is(err, errProcessGone) {
			// It died by itself before the stop took: try its successor.
			if err := relay.WaitReady(ctx); err != nil {
				return "", err
			}
			continue
		}
		if err != nil {
			_ = inc.cmd.Process.Signal(syscall.SIGCONT)
			return "", err
		}
		if n, err = held(inc); err != nil {
			_ = inc.cmd.Process.Signal(syscall.SIGCONT)
			return "", err
		}
		if n > 0 || last {
			break
		}
		if err := inc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return "", err
		}
	}
	frozen := time.Now()
	ended := time.Duration(0)
	for ended == 0 && time.Since(frozen) < r.prof.RelayLease+30*time.Second {
		left, err := held(inc)
		if err != nil {
			_ = inc.cmd.Process.Signal(syscall.SIGCONT)
			return "", err
		}
		if left == 0 {
			ended = time.Since(frozen)
			break
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			_ = inc.cmd.Process.Signal(syscall.SIGCONT)
			return "", ctx.Err()
		}
	}
	if ended == 0 {
		_ = inc.cmd.Process.Signal(syscall.SIGCONT)
		return "", fmt.Errorf("%s frozen holding %d batches: PostgreSQL had not ended their transactions %v later (RelayLease %v)",
			relay.Name(), n, time.Since(frozen).Round(time.Millisecond), r.prof.RelayLease)
	}
	sleepCtx(ctx, time.Second)
	if err := inc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s frozen %v holding %d batches (%d tries); PostgreSQL ended their transactions %v after the stop (RelayLease %v)",
		relay.Name(), time.Since(frozen).Round(time.Millisecond), n, tries, ended.Round(time.Millisecond), r.prof.RelayLease), nil
}

// freezeMidHandler SIGSTOPs target (PostgreSQL transport) at a moment when
// one of its handlers has written in its transaction and not committed:
// a session of the process (found by its application_name) is idle in a
// transaction that wrote an effect, follow-up or queue row, which is the
// handler's HandlerDelay, before the inbox mark. Frozen there, the handler
// is certain to attempt a late commit when it resumes, which the inbox
// must refuse. pg_stat_activity is the signal: it polls it, and when the
// transaction turns out to have committed before the stop took effect
// (the state, re-read while the process is stopped, is stable), it resumes
// the process and tries again. After 20s without success it freezes
// target as it is (mid reports false). The returned incarnation is
// stopped.
func (r *run) freezeMidHandler(ctx context.Context, target *Proc) (inc *incarnation, mid bool, tries int, err error) {
	appName := workload.ApplicationName(r.names.Run, target.Name(), target.Pid())
	const q = `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = ? AND state = 'idle in transaction'
    AND backend_xid IS NOT NULL AND (position(? in query) > 0 OR position(? in query) > 0 OR position(? in query) > 0)`
	args := []any{appName, r.names.Table(workload.TableEffects), r.names.Table(workload.TableFollowups), r.names.TransportTables()[0]}
	midTx := func() (bool, error) {
		var n int
		err := r.db.WithContext(ctx).Raw(q, args...).Scan(&n).Error
		return n > 0, err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		busy, err := midTx()
		if err != nil {
			return nil, false, tries, err
		}
		last := time.Now().After(deadline)
		if !busy && !last {
			if !sleepCtx(ctx, 2*time.Millisecond) {
				return nil, false, tries, ctx.Err()
			}
			continue
		}
		tries++
		inc, err := target.Signal(syscall.SIGSTOP)
		if err != nil {
			return nil, false, tries, err
		}
		if err := waitStopped(ctx, inc.cmd.Process.Pid); err != nil {
			_ = inc.cmd.Process.Signal(syscall.SIGCONT)
			return nil, false, tries, err
		}
		if last {
			return inc, false, tries, nil
		}
		busy, err = midTx()
		if err != nil {
			_ = inc.cmd.Process.Signal(syscall.SIGCONT)
			return nil, false, tries, err
		}
		if busy {
			return inc, true, tries, nil
		}
		if err := inc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return nil, false, tries, err
		}
	}
}

// waitStopped waits until the kernel reports process pid stopped: a
// SIGSTOP is delivered asynchronously, and a process that still runs for a
// moment could notice its cut connections.
func waitStopped(ctx context.Context, pid int) error {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %v", errProcessGone, err)
		}
		if err != nil {
			return err
		}
		// The state follows the parenthesized command name.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
			switch b[i+2] {
			case 'T', 't':
				return nil
			case 'Z', 'X':
				return fmt.Errorf("%w: process %d is a zombie", errProcessGone, pid)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d did not stop within 5s", pid)
		}
		if !sleepCtx(ctx, time.Millisecond) {
			return ctx.Err()
		}
	}
}

// errProcessGone is waitStopped's error for a process that exited before
// it stopped.
var errProcessGone = errors.New("process exited before it stopped")

// sleepCtx waits d or until ctx is done; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// DefaultPGRestart returns the command that restarts PostgreSQL, or nil
// to skip that fault. A restart breaks every client of the server, such as
// the integration tests of other packages that `go test ./...` runs at the
// same time, so it is opt-in:
//
//   - BAREWIRE_TEST_PG_RESTART_CMD, when set, is the command (split on
//     spaces; "none" disables);
//   - otherwise, with BAREWIRE_RELIABILITY_PG_RESTART=1 (which `make
//     reliability` sets), pg_ctlcluster restarts the only cluster under
//     /etc/postgresql.
func DefaultPGRestart() []string {
	if v := os.Getenv("BAREWIRE_TEST_PG_RESTART_CMD"); v != "" {
		if v == "none" {
			return nil
		}
		return strings.Fields(v)
	}
	if os.Getenv("BAREWIRE_RELIABILITY_PG_RESTART") != "1" {
		return nil
	}
	ctl, err := exec.LookPath("pg_ctlcluster")
	if err != nil {
		return nil
	}
	versions, err := os.ReadDir("/etc/postgresql")
	if err != nil || len(versions) != 1 {
		return nil
	}
	return []string{ctl, "--skip-systemctl-redirect", versions[0].Name(), "main", "restart"}
}

// DefaultRabbitmqctl returns the rabbitmqctl command: BAREWIRE_TEST_RABBITMQCTL
// when set (split on spaces; "none" disables), else rabbitmqctl on PATH,
// else nil.
func DefaultRabbitmqctl() []string {
	if v := os.Getenv("BAREWIRE_TEST_RABBITMQCTL"); v != "" {
		if v == "none" {
			return nil
		}
		return strings.Fields(v)
	}
	if p, err := exec.LookPath("rabbitmqctl"); err == nil {
		return []string{p}
	}
	return nil
}
