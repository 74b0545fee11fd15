// Package sample holds what every sample shares: the flags that select the
// transport (embedded, RabbitMQ or PostgreSQL) and the database, JSON helpers, health routes and a clean shutdown
// on SIGINT/SIGTERM.
package sample

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
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
)

// Transports that -transport selects.
const (
	TransportEmbedded = "embedded" // in-process transport; inbox/outbox in SQLite, or in -postgres-dsn
	TransportRabbitMQ = "rabbitmq" // RabbitMQ at -amqp-url; inbox/outbox as for embedded
	TransportPostgres = "postgres" // PostgreSQL at -postgres-dsn: queues, inbox and outbox in one database
	// Watermill Pub/Subs through transport/wmpubsub; inbox/outbox as for embedded.
	TransportNATS   = "nats"   // NATS JetStream at -nats-url (wmnats)
	TransportRedis  = "redis"  // Redis Streams at -redis-addr (wmredis)
	TransportWMAMQP = "wmamqp" // RabbitMQ at -amqp-url through watermill-amqp (wmamqp)
)

// Transports lists the values -transport accepts.
var Transports = []string{TransportEmbedded, TransportRabbitMQ, TransportPostgres, TransportNATS, TransportRedis, TransportWMAMQP}

// Flags are the settings every sample accepts. Environment variables
// BAREWIRE_TRANSPORT, BAREWIRE_AMQP_URL, BAREWIRE_POSTGRES_DSN and
// BAREWIRE_LISTEN give defaults.
type Flags struct {
	// TransportName is -transport: one of Transports. Empty
	// picks rabbitmq when AMQPURL is set and embedded otherwise; Kind
	// resolves it.
	TransportName string
	AMQPURL       string
	PostgresDSN   string
	NATSURL       string
	RedisAddr     string
	Listen        string
	Demo          bool
}

// ParseFlags parses the command line. An invalid transport selection (an
// unknown -transport, rabbitmq without -amqp-url, postgres without
// -postgres-dsn) exits with status 2 and says what is missing.
func ParseFlags(defaultListen string) Flags {
	var f Flags
	flag.StringVar(&f.TransportName, "transport", os.Getenv("BAREWIRE_TRANSPORT"), "transport: "+strings.Join(Transports, ", ")+"; default rabbitmq when -amqp-url is given, else embedded")
	flag.StringVar(&f.AMQPURL, "amqp-url", os.Getenv("BAREWIRE_AMQP_URL"), "RabbitMQ URL (amqp://user:pass@host:5672/vhost) for -transport rabbitmq; given alone, it selects rabbitmq")
	flag.StringVar(&f.PostgresDSN, "postgres-dsn", os.Getenv("BAREWIRE_POSTGRES_DSN"), "PostgreSQL DSN: the database of -transport postgres; on the other transports the inbox/outbox database (empty: embedded in-memory SQLite)")
	flag.StringVar(&f.NATSURL, "nats-url", envOr("BAREWIRE_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL (JetStream on) for -transport nats")
	flag.StringVar(&f.RedisAddr, "redis-addr", envOr("BAREWIRE_REDIS_ADDR", "127.0.0.1:6379"), "Redis address for -transport redis")
	flag.StringVar(&f.Listen, "listen", envOr("BAREWIRE_LISTEN", defaultListen), "HTTP listen address")
	flag.BoolVar(&f.Demo, "demo", false, "run the scripted demo, print what happened and exit (no HTTP server)")
	flag.Parse()
	if _, err := f.Kind(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
		os.Exit(2)
	}
	return f
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Kind returns the selected transport, one of Transports, or an error that
// says why the selection cannot work (including a selection this build
// left out: see Options).
func (f Flags) Kind() (string, error) {
	kind, err := f.kind()
	if err == nil && services == nil && (kind != TransportEmbedded || f.PostgresDSN != "") {
		what := "-transport " + kind
		if kind == TransportEmbedded {
			what = "-postgres-dsn"
		}
		err = fmt.Errorf("%s: this binary was built with -tags embedded (the in-process transport and SQLite only); build it without the tag to use %s", what, what)
	}
	return kind, err
}

func (f Flags) kind() (string, error) {
	name := strings.ToLower(strings.TrimSpace(f.TransportName))
	switch name {
	case "":
		if f.AMQPURL != "" {
			return TransportRabbitMQ, nil
		}
		return TransportEmbedded, nil
	case TransportEmbedded:
		return name, nil
	case TransportRabbitMQ:
		if f.AMQPURL == "" {
			return "", errors.New("-transport rabbitmq needs -amqp-url (or BAREWIRE_AMQP_URL), e.g. amqp://guest:guest@127.0.0.1:5672/")
		}
		return name, nil
	case TransportWMAMQP:
		if f.AMQPURL == "" {
			return "", errors.New("-transport wmamqp needs -amqp-url (or BAREWIRE_AMQP_URL), e.g. amqp://guest:guest@127.0.0.1:5672/")
		}
		return name, nil
	case TransportNATS:
		if f.NATSURL == "" {
			return "", errors.New("-transport nats needs -nats-url (or BAREWIRE_NATS_URL), e.g. nats://127.0.0.1:4222")
		}
		return name, nil
	case TransportRedis:
		if f.RedisAddr == "" {
			return "", errors.New("-transport redis needs -redis-addr (or BAREWIRE_REDIS_ADDR), e.g. 127.0.0.1:6379")
		}
		return name, nil
	case TransportPostgres:
		if f.PostgresDSN == "" {
			return "", errors.New("-transport postgres needs -postgres-dsn (or BAREWIRE_POSTGRES_DSN), e.g. 'host=127.0.0.1 user=postgres dbname=app sslmode=disable'")
		}
		return name, nil
	}
	return "", fmt.Errorf("-transport %q: use one of %s", f.TransportName, strings.Join(Transports, ", "))
}

// Options turns the flags into bus options. declare declares the sample's
// endpoints inside the block of whichever transport is selected (the one
// way to declare receive endpoints); configure, if not nil, adjusts the
// inbox/outbox options.
//
//   - embedded: the in-process transport; the inbox and outbox in
//     PostgreSQL when -postgres-dsn is given, in in-memory SQLite otherwise.
//   - rabbitmq: RabbitMQ at -amqp-url; the inbox and outbox as for embedded.
//   - postgres: the PostgreSQL transport on -postgres-dsn; its queues, the
//     inbox and the outbox share that database.
//   - nats, redis, wmamqp: the Watermill presets (transport/wmpubsub) on
//     -nats-url, -redis-addr, -amqp-url; the inbox and outbox as for
//     embedded.
//
// A normal build links every transport, since the flag picks one at run
// time. Built with -tags embedded, a sample links only the in-process
// transport and SQLite (a first build compiles about half as much), and
// any other selection is refused with an error that says how to build it.
func (f Flags) Options(declare func(*endpoint.Endpoints), configure func(*outbox.Options)) ([]bus.Option, error) {
	kind, err := f.Kind()
	if err != nil {
		return nil, err
	}
	opts := []bus.Option{bus.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))}
	if configure != nil {
		opts = append(opts, bus.WithOutbox(configure))
	}
	if kind == TransportEmbedded && f.PostgresDSN == "" {
		return append(opts, bus.WithTransport(inproc.New(func(c *inproc.Config) { declare(&c.Endpoints) }))), nil
	}
	more, err := services(f, kind, declare)
	if err != nil {
		return nil, err
	}
	return append(opts, more...), nil
}

// services returns the options of every selection but the embedded
// default: the transport, and the PostgreSQL database when -postgres-dsn
// is given. Nil in a build with -tags embedded (services.go).
var services func(f Flags, kind string, declare func(*endpoint.Endpoints)) ([]bus.Option, error)

// NewBus builds the sample's bus: Options, then extra options after them.
func (f Flags) NewBus(declare func(*endpoint.Endpoints), configure func(*outbox.Options), extra ...bus.Option) (*bus.Bus, error) {
	opts, err := f.Options(declare, configure)
	if err != nil {
		return nil, err
	}
	return bus.New(append(opts, extra...)...)
}

// DemoTimeout bounds a sample's -demo run (RunDemo) unless the sample
// gives Run another one.
const DemoTimeout = time.Minute

// Run runs the sample the way the flags ask: with -demo, demo through
// RunDemo within timeout (DemoTimeout when zero); otherwise Serve with
// mux, to which it adds GET /stats (the bus's Stats) unless mux has one.
// The error is the demo's (prefixed "demo: ") or the server's.
func (f Flags) Run(b *bus.Bus, mux *http.ServeMux, demo func(ctx context.Context) error, timeout time.Duration, afterStart ...func(context.Context) error) error {
	if f.Demo {
		if timeout <= 0 {
			timeout = DemoTimeout
		}
		if err := RunDemo(b, timeout, demo); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		return nil
	}
	if _, pattern := mux.Handler(&http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/stats"}}); pattern == "" {
		mux.HandleFunc("GET /stats", Stats(b))
	}
	return Serve(b, mux, f.Listen, afterStart...)
}

// Is reports whether kind (one of Transports) is the selected transport.
func (f Flags) Is(kind string) bool {
	k, err := f.Kind()
	return err == nil && k == kind
}

// OnPostgres reports whether the database (of the inbox, the outbox and the
// sample's own tables) is PostgreSQL rather than SQLite.
func (f Flags) OnPostgres() bool { return f.PostgresDSN != "" }

// Transport names the selected transport and database for the console.
func (f Flags) Transport() string {
	kind, err := f.Kind()
	if err != nil {
		return "invalid transport (" + err.Error() + ")"
	}
	switch kind {
	case TransportPostgres:
		return "PostgreSQL transport + PostgreSQL (queues, inbox and outbox in one database)"
	case TransportRabbitMQ:
		return "RabbitMQ + " + f.database()
	case TransportWMAMQP:
		return "RabbitMQ through watermill-amqp + " + f.database()
	case TransportNATS:
		return "NATS JetStream through watermill-nats + " + f.database()
	case TransportRedis:
		return "Redis Streams through watermill-redisstream + " + f.database()
	}
	return "in-process + " + f.database()
}

func (f Flags) database() string {
	if f.PostgresDSN != "" {
		return "PostgreSQL"
	}
	return "SQLite (in memory)"
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// WriteError writes {"error": err} with status.
func WriteError(w http.ResponseWriter, status int, err error) {
	WriteJSON(w, status, map[string]string{"error": err.Error()})
}

// Serve mounts the health routes on mux, starts the bus, runs each
// afterStart function (creating the sample's tables, say), serves HTTP on
// addr until SIGINT/SIGTERM, then shuts both down cleanly.
func Serve(b *bus.Bus, mux *http.ServeMux, addr string, afterStart ...func(context.Context) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h := b.HealthHandler()
	mux.Handle("GET /health", h)
	mux.Handle("GET /health/live", h)
	mux.Handle("GET /health/ready", h)
	if err := b.Start(ctx); err != nil {
		return err
	}
	for _, fn := range afterStart {
		if err := fn(ctx); err != nil {
			_ = b.Stop(context.Background())
			return err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = b.Stop(context.Background())
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(os.Stderr, "listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	shutdownErr := srv.Shutdown(sctx)
	stopErr := b.Stop(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, shutdownErr, stopErr)
}

// ReadJSON decodes a JSON request body into v when there is one (an empty
// body leaves v as it is, so that callers can fall back to query
// parameters). Bodies over 1 MiB and unknown fields are refused.
func ReadJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if r.Body == nil || r.ContentLength == 0 {
		return nil
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // chunked request with an empty body
		}
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

// RunDemo starts b, runs scenario with a context that ends after timeout or
// on SIGINT/SIGTERM, and stops b. It returns the scenario's error joined
// with any error from starting or stopping the bus.
func RunDemo(b *bus.Bus, timeout time.Duration, scenario func(ctx context.Context) error) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		err = errors.Join(err, b.Stop(sctx))
	}()
	return scenario(ctx)
}

// WaitUntil calls cond every 10ms until it reports true, fails, or ctx
// ends; what names the awaited condition in the timeout error.
func WaitUntil(ctx context.Context, what string, cond func() (bool, error)) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// Checks collects a demo's expectations: each is printed as it is checked,
// and Err reports the ones that failed.
type Checks struct {
	failed []string
}

// Expect prints the expectation with its outcome and records a failure.
func (c *Checks) Expect(ok bool, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if ok {
		fmt.Printf("  ok    %s\n", msg)
		return
	}
	fmt.Printf("  FAIL  %s\n", msg)
	c.failed = append(c.failed, msg)
}

// Err returns nil when every expectation held, otherwise an error listing
// the ones that did not.
func (c *Checks) Err() error {
	if len(c.failed) == 0 {
		return nil
	}
	return fmt.Errorf("%d expectation(s) failed: %s", len(c.failed), strings.Join(c.failed, "; "))
}

// RunID returns a short random id that a demo puts into its message ids and
// business keys, so that rows and messages left by earlier runs on a
// persistent database or broker do not count towards this run's checks.
func RunID() string { return uuid.NewString()[:8] }
