// Command standalone-relay runs only BareWire's outbox relay: it delivers
// the rows that services committed to their outbox in PostgreSQL to
// RabbitMQ, and consumes nothing. It is the deployment in which the
// services that publish (bus.PublishTx in their own transactions) run no
// relay, or too little of one, and a separate process, scaled on its own,
// drains the outbox. Any number of copies may run against one database:
// each batch is leased to one relay and marked delivered only after the
// broker confirmed it.
//
//	go run ./samples/standalone-relay -postgres-dsn 'host=127.0.0.1 user=postgres dbname=app sslmode=disable' \
//	    -amqp-url amqp://guest:guest@127.0.0.1:5672/
//
// It is built from public packages only: gormstore (the outbox table),
// outbox.Relay and outbox.Cleaner (the algorithms), and transport/rabbitmq
// built with transport.Env and started with no endpoints. It deletes
// delivered rows after -retention, which the publishing services' buses
// do only while they run started.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "standalone-relay: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(ctx, cfg, log, nil); err != nil {
		log.Error("standalone-relay failed", "error", err.Error())
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	PostgresDSN string
	AMQPURL     string
	// Owner names this relay in the rows' leases.
	Owner string
	// Migrate creates or upgrades the inbox and outbox tables at start.
	Migrate bool
	// Listen, when set, serves GET /health on this address.
	Listen string
	// Outbox holds the relay's settings (TablePrefix, PollingInterval,
	// DispatchBatchSize, RelayWorkers, RelayLease, MaxAttempts,
	// DeleteOnDeliver) and the cleanup's (OutboxRetention,
	// CleanupInterval, CleanupBatchSize), with the bus's defaults.
	Outbox outbox.Options
}

// parseFlags parses args. BAREWIRE_POSTGRES_DSN and BAREWIRE_AMQP_URL give
// the defaults of -postgres-dsn and -amqp-url.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	o := &c.Outbox
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("standalone-relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The environment's defaults apply after parsing, so that -h never
	// prints a password.
	fs.StringVar(&c.PostgresDSN, "postgres-dsn", "", "PostgreSQL DSN of the database with the outbox table (default $BAREWIRE_POSTGRES_DSN)")
	fs.StringVar(&c.AMQPURL, "amqp-url", "", "RabbitMQ URL, amqp:// or amqps:// (default $BAREWIRE_AMQP_URL)")
	fs.StringVar(&o.TablePrefix, "prefix", gormstore.DefaultTablePrefix, "table prefix of the outbox (the services' outbox.Options.TablePrefix)")
	fs.StringVar(&c.Owner, "owner", fmt.Sprintf("standalone-relay-%s-%d", host, os.Getpid()), "this relay's name in leases; unique per process")
	fs.BoolVar(&c.Migrate, "migrate", false, "create or upgrade the inbox and outbox tables at start (off: the services or your migration tool own the schema)")
	fs.StringVar(&c.Listen, "listen", "", "serve GET /health on this address, e.g. 127.0.0.1:8090 (default: no HTTP server)")
	fs.DurationVar(&o.PollingInterval, "polling-interval", outbox.DefaultPollingInterval, "safety-net poll; commits on PostgreSQL wake the relay sooner")
	fs.IntVar(&o.DispatchBatchSize, "batch-size", outbox.DefaultDispatchBatchSize, "rows per claim, 1-10000")
	fs.IntVar(&o.RelayWorkers, "workers", outbox.DefaultRelayWorkers, "batches in flight at once")
	fs.DurationVar(&o.RelayLease, "lease", outbox.DefaultLease, "how long a claimed batch stays reserved; at least twice RabbitMQ's publish timeout, which defaults to half of it")
	fs.IntVar(&o.MaxAttempts, "max-attempts", outbox.DefaultMaxAttempts, "park a row after this many failed deliveries")
	fs.BoolVar(&o.DeleteOnDeliver, "delete-on-deliver", false, "delete rows once the broker confirmed them instead of keeping them for -retention")
	fs.DurationVar(&o.OutboxRetention, "retention", outbox.DefaultRetention, "delete delivered rows older than this")
	fs.DurationVar(&o.CleanupInterval, "cleanup-interval", outbox.DefaultCleanupInterval, "how often the cleanup of delivered rows runs")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.PostgresDSN == "" {
		c.PostgresDSN = os.Getenv("BAREWIRE_POSTGRES_DSN")
	}
	if c.AMQPURL == "" {
		c.AMQPURL = os.Getenv("BAREWIRE_AMQP_URL")
	}
	var errs []error
	if c.PostgresDSN == "" {
		errs = append(errs, errors.New("-postgres-dsn (or BAREWIRE_POSTGRES_DSN) is required, e.g. 'host=127.0.0.1 user=postgres dbname=app sslmode=disable'"))
	}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("-amqp-url (or BAREWIRE_AMQP_URL) is required, e.g. amqp://guest:guest@127.0.0.1:5672/"))
	}
	if c.Owner == "" {
		errs = append(errs, errors.New("-owner is empty"))
	}
	o.Defaults()
	errs = append(errs, o.Validate()...)
	return c, errors.Join(errs...)
}

// run relays until ctx ends. ready, when not nil, is called once the
// relay runs (the database opened, the broker connected).
func run(ctx context.Context, cfg config, log *slog.Logger, ready func()) error {
	o := cfg.Outbox
	o.Defaults()
	// Build checks the URL and the lease against the publish timeout; it
	// does no I/O. The relay passes no endpoints to Start: it declares
	// only the exchanges it publishes to, as it first meets them.
	// snippet:start transport
	rmq := rabbitmq.New(cfg.AMQPURL, nil)
	tr, err := rmq.Build(transport.Env{Logger: log, RelayLease: o.RelayLease})
	if err != nil {
		return err
	}
	defer func() { _ = tr.Close() }()
	// snippet:end transport
	db, err := postgresdb.Open(cfg.PostgresDSN)
	if err != nil {
		return err
	}
	defer func() { _ = gormstore.Close(db) }()
	st, err := gormstore.New(db, gormstore.WithTablePrefix(o.TablePrefix))
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	if cfg.Migrate {
		if err := st.Migrate(ctx); err != nil {
			return fmt.Errorf("create tables: %w", err)
		}
	}
	if err := tr.Start(ctx, nil); err != nil {
		return err
	}

	// snippet:start relay
	relay := &outbox.Relay{
		Store: st.Outbox(), Transport: tr, Owner: cfg.Owner,
		PollingInterval: o.PollingInterval, BatchSize: o.DispatchBatchSize, Workers: o.RelayWorkers,
		Lease: o.RelayLease, MaxAttempts: o.MaxAttempts, DeleteOnDeliver: o.DeleteOnDeliver,
		// LISTEN for the services' commits: their stores NOTIFY the
		// outbox's channel once a transaction that added rows commits.
		Notifier: st.Outbox(),
		Logger:   log,
	}
	cleaner := &outbox.Cleaner{Store: st.Outbox(), Retention: o.OutboxRetention, Interval: o.CleanupInterval, Batch: o.CleanupBatchSize, Logger: log}
	// snippet:end relay

	var srv *http.Server
	if cfg.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return err
		}
		srv = &http.Server{Handler: healthHandler(db, tr), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		log.Info("health on http://" + ln.Addr().String() + "/health")
	}

	var wg sync.WaitGroup
	wg.Go(func() { relay.Run(ctx) })
	wg.Go(func() { cleaner.Run(ctx) })
	log.Info("relay started", "owner", cfg.Owner, "table_prefix", o.TablePrefix, "broker", rmq.URL())
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	// The rows a stopped relay had leased and not marked go back to the
	// others when their lease ends; the consumers' inboxes absorb a
	// second delivery.
	wg.Wait()
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}
	log.Info("relay stopped")
	return nil
}

// healthHandler answers GET /health with 200 while the database answers
// and the broker connection is up, 503 (with the reason) otherwise.
func healthHandler(db *gorm.DB, tr transport.Transport) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		status, body := http.StatusOK, map[string]string{"database": "ok", "broker": "ok"}
		if sqlDB, err := db.DB(); err != nil {
			status, body["database"] = http.StatusServiceUnavailable, err.Error()
		} else if err := sqlDB.PingContext(ctx); err != nil {
			status, body["database"] = http.StatusServiceUnavailable, err.Error()
		}
		if err := tr.Health(ctx); err != nil {
			status, body["broker"] = http.StatusServiceUnavailable, err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	})
	return mux
}
