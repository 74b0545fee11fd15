// Command barewire-testsvc is the service the reliability suite (package
// reliability) starts, kills and checks. One process plays one or more
// roles against a shared RabbitMQ broker and PostgreSQL database, or, with
// -transport postgres (BWTESTSVC_TRANSPORT=postgres), against PostgreSQL
// alone: the PostgreSQL transport's queue tables carry the messages (they
// share the run's table prefix), PublishTx and the consumers' publishes
// write queue rows in their own transaction (no outbox row, no relay hop),
// and -pg-lease sets how soon a killed or frozen consumer's message is
// claimed again. Every process sets application_name on its database
// connections to workload.ApplicationName, so that the harness can find
// its sessions in pg_stat_activity. The roles:
//
//   - producer: commits orders through bus.PublishTx, each in a transaction
//     that also writes a produced row; rolls back a fraction of them
//     (recording their ids afterwards) and re-publishes a fraction of
//     committed ids with the same message-id header. It exits 0 once the
//     produced table holds -messages rows, unless it plays another role.
//   - consumer: starts a bus with three endpoints. <run>-ledger and
//     <run>-notify consume orders, each writing one effect row through
//     bus.TxFromContext and publishing one follow-up through the outbox;
//     <run>-audit consumes the follow-ups, writing one row each. A started
//     bus also runs an outbox relay.
//   - relay: runs a stand-alone outbox relay whose -kill-after-confirm hook
//     SIGKILLs the process after the broker confirmed a batch and before
//     the rows are marked delivered.
//
// Faults: -handler-delay keeps each handler's transaction open after its
// writes so that kills land mid-handler; -fail-first fails the first
// attempt of a fraction of messages.
//
// The service logs JSON to stderr: "ready" once its roles run, "stats"
// every -stats-interval, "producer done", "kill-after-confirm" and "inbox
// fencing refused a late commit" (see logging.go). It never logs the
// passwords of its connection strings. SIGTERM or SIGINT stop it gracefully.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/reliability/workload"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, context.Canceled) {
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("barewire-testsvc failed", "error", err.Error())
		os.Exit(1)
	}
}

// service is one process with its roles.
type service struct {
	cfg    *config
	log    *slog.Logger
	db     *gorm.DB
	bus    *bus.Bus
	fenced atomic.Int64
	// reconnects counts lost transport connections (see fenceWatcher).
	reconnects atomic.Int64

	consumers *consumers
	producer  *producer
	relay     *relayRole
}

func run(ctx context.Context, args []string) error {
	cfg, err := parseConfig(args)
	if err != nil {
		return err
	}
	level, err := parseLevel(cfg.LogLevel)
	if err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	s := &service{cfg: cfg}
	s.log = newLogger(os.Stderr, level, &s.fenced, &s.reconnects).With("instance", cfg.Instance)
	attrs := []any{"roles", cfg.Roles, "run", cfg.Names.Run, "table_prefix", cfg.Names.Prefix, "transport", cfg.Transport}
	if cfg.Transport == transportRabbitMQ {
		attrs = append(attrs, "amqp_url", redactURL(cfg.AMQPURL))
	} else {
		attrs = append(attrs, "pg_lease", cfg.PGLease)
	}
	appName := workload.ApplicationName(cfg.Names.Run, cfg.Instance, os.Getpid())
	attrs = append(attrs, "postgres_dsn", redactDSN(cfg.PostgresDSN), "application_name", appName,
		"inbox_lock_timeout", cfg.InboxLockTimeout, "relay_lease", cfg.RelayLease,
		"handler_delay", cfg.HandlerDelay, "fail_first", cfg.FailFirst, "kill_after_confirm", cfg.KillAfterConfirm)
	s.log.Info("starting", attrs...)

	dsn, err := withApplicationName(cfg.PostgresDSN, appName)
	if err != nil {
		return err
	}
	db, err := postgresdb.Open(dsn)
	if err != nil {
		return err
	}
	s.db = db
	defer func() { _ = gormstore.Close(db) }()
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.SetMaxOpenConns(cfg.PoolSize)
		sqlDB.SetMaxIdleConns(cfg.PoolSize)
	}

	if err := s.newBus(); err != nil {
		return err
	}
	if err := s.migrate(ctx); err != nil {
		return err
	}
	return s.runRoles(ctx)
}

// newBus builds the bus. Only the consumer role starts it; the producer
// role uses it unstarted, for PublishTx (which writes outbox rows on
// RabbitMQ, and queue rows in the producer's transaction on the PostgreSQL
// transport).
func (s *service) newBus() error {
	cfg := s.cfg
	declare := func(e *endpoint.Endpoints) {
		if cfg.has(roleConsumer) {
			s.consumers = &consumers{cfg: cfg}
			s.consumers.declare(e)
		}
	}
	var tr bus.Option
	switch cfg.Transport {
	case transportPostgres:
		// The outbox below is on the same *gorm.DB, so PublishTx and the
		// consumers' publishes write queue rows in their own transaction:
		// no outbox row, no relay hop.
		tr = bus.WithTransport(pgtransport.New(s.db, func(c *pgtransport.Config) {
			declare(&c.Endpoints)
			c.TablePrefix = cfg.Names.TransportPrefix()
			c.Lease = cfg.PGLease
			c.PollInterval = cfg.PollingInterval
		}))
	case transportWMAMQP, transportWMNATS, transportWMRedis:
		f, err := cfg.watermillFactory(declare)
		if err != nil {
			return err
		}
		tr = bus.WithTransport(f)
	default:
		tr = bus.WithTransport(rabbitmq.New(cfg.AMQPURL, func(c *rabbitmq.Config) {
			declare(&c.Endpoints)
			c.QueueType = endpoint.QueueType(cfg.QueueType)
		}))
	}
	opts := []bus.Option{
		bus.WithLogger(s.log),
		bus.WithInstanceID(cfg.Instance),
		bus.WithStopTimeout(cfg.StopTimeout),
		tr,
		bus.WithDatabase(s.db),
		bus.WithOutbox(func(o *outbox.Options) {
			o.TablePrefix = cfg.Names.Prefix
			o.InboxLockTimeout = cfg.InboxLockTimeout
			o.RelayLease = cfg.RelayLease
			o.PollingInterval = cfg.PollingInterval
		}),
	}
	b, err := bus.New(opts...)
	if err != nil {
		return err
	}
	s.bus = b
	return nil
}

// migrate runs the bus's migrations and creates the business tables
// unless they exist, retrying while the database is unreachable (a
// restarted process may come up during a PostgreSQL restart).
//
// Every process runs gormstore's Migrate at every (re)start, beside live
// traffic, as a real deployment does; so does the bus's Start for its
// inbox, outbox and transport tables. On an up-to-date schema they run no
// DDL (CREATE INDEX IF NOT EXISTS would lock the live tables), which is
// what this exercises.
func (s *service) migrate(ctx context.Context) error {
	st, err := gormstore.New(s.db, gormstore.WithTablePrefix(s.cfg.Names.Prefix))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(s.cfg.StartTimeout)
	for {
		err := st.Migrate(ctx)
		if err == nil {
			var exists bool
			if exists, err = s.tablesExist(ctx); err == nil && !exists {
				s.log.Info("creating tables")
				err = workload.Migrate(ctx, s.db, s.cfg.Names)
				if err == nil && s.cfg.Transport == transportPostgres {
					err = workload.MigrateTransport(ctx, s.db, s.cfg.Names)
				}
			}
		}
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		s.log.Warn("migrating failed; retrying", "error", err)
		sleep(ctx, 500*time.Millisecond)
	}
}

// tablesExist reports whether every table of the run exists.
func (s *service) tablesExist(ctx context.Context) (bool, error) {
	var names []string
	for _, t := range append([]string{"inbox", "outbox"}, workload.Tables...) {
		names = append(names, s.cfg.Names.Table(t))
	}
	if s.cfg.Transport == transportPostgres {
		names = append(names, s.cfg.Names.TransportTables()...)
	}
	for _, t := range names {
		var found *string
		if err := s.db.WithContext(ctx).Raw("SELECT to_regclass(?)::text", t).Scan(&found).Error; err != nil {
			return false, err
		}
		if found == nil {
			return false, nil
		}
	}
	return true, nil
}

func (s *service) runRoles(ctx context.Context) error {
	cfg := s.cfg
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 3)

	if cfg.has(roleConsumer) {
		if err := s.startBus(ctx); err != nil {
			return err
		}
	}
	stopped := false
	stopBus := func() {
		if cfg.has(roleConsumer) && !stopped {
			stopped = true
			s.stopBus()
		}
	}
	defer stopBus()
	if cfg.has(roleRelay) {
		s.relay = &relayRole{cfg: cfg, db: s.db, log: s.log.With("role", roleRelay)}
		started := make(chan struct{})
		wg.Go(func() {
			if err := s.relay.run(runCtx, func() { close(started) }); err != nil {
				errs <- fmt.Errorf("relay: %w", err)
			}
		})
		select {
		case <-started:
		case err := <-errs:
			cancel()
			wg.Wait()
			return err
		}
	}
	wg.Go(func() { s.reportStats(runCtx) })

	producerDone := make(chan struct{})
	if cfg.has(roleProducer) {
		s.producer = newProducer(cfg, s.bus, s.db, s.log.With("role", roleProducer))
		wg.Go(func() {
			defer close(producerDone)
			if err := s.producer.run(runCtx); err != nil && runCtx.Err() == nil {
				errs <- fmt.Errorf("producer: %w", err)
			}
		})
	}
	s.log.Info(msgReady, "roles", cfg.Roles)

	var err error
	switch {
	case len(cfg.Roles) == 1 && cfg.has(roleProducer):
		// A pure producer exits once its work is done.
		select {
		case <-producerDone:
		case <-ctx.Done():
		case err = <-errs:
		}
	default:
		select {
		case <-ctx.Done():
		case err = <-errs:
		}
	}
	cancel()
	wg.Wait()
	stopBus()
	s.logStats()
	return err
}

func (s *service) startBus(ctx context.Context) error {
	deadline := time.Now().Add(s.cfg.StartTimeout)
	for {
		err := s.bus.Start(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		// A bus runs once: a failed Start leaves it unusable, so build a
		// new one for the next attempt.
		s.log.Warn("starting the bus failed; retrying", "error", err)
		sleep(ctx, 500*time.Millisecond)
		if err := s.newBus(); err != nil {
			return err
		}
	}
}

func (s *service) stopBus() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StopTimeout+5*time.Second)
	defer cancel()
	if err := s.bus.Stop(ctx); err != nil {
		s.log.Warn("stopping the bus", "error", err)
	}
}

func (s *service) reportStats(ctx context.Context) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.logStats()
		}
	}
}

// logStats logs every counter; the harness keeps the last line of each
// process incarnation.
func (s *service) logStats() {
	attrs := []any{"fenced", s.fenced.Load(), "reconnects", s.reconnects.Load()}
	if s.cfg.has(roleConsumer) {
		st := s.bus.Stats()
		attrs = append(attrs, "consumed", st.Consumed, "duplicates", st.Duplicates, "retries", st.Retries,
			"dead_lettered", st.DeadLettered, "requeued", st.Requeued, "in_flight", st.InFlight,
			"handler_attempts", s.consumers.attempts.Load(), "injected_failures", s.consumers.injected.Load())
	}
	if p := s.producer; p != nil {
		attrs = append(attrs, "committed", p.committed.Load(), "rolled_back", p.rolledBack.Load(),
			"republished", p.republished.Load(), "producer_failures", p.failed.Load(),
			"poison_sent", p.poisonSent.Load(), "poison_refused", p.poisonRefused.Load())
	}
	if r := s.relay; r != nil {
		attrs = append(attrs, "relay_delivered", r.delivered.Load())
	}
	s.log.Info(msgStats, attrs...)
}
