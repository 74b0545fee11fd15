package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// pgEnv is one test's share of PostgreSQL for the PostgreSQL transport: a
// database handle and a table prefix used by the transport, the inbox and
// the outbox alike. Its tables are dropped when the test ends.
type pgEnv struct {
	dsn    string
	db     *gorm.DB
	prefix string
	suffix string
	dbs    []*gorm.DB
}

func newPgEnv(t testing.TB) *pgEnv {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	s := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	e := &pgEnv{dsn: dsn, prefix: "bp_" + s + "_", suffix: s}
	e.db = e.open(t)
	t.Cleanup(func() {
		for _, tbl := range []string{"inbox", "outbox", "queue_messages", "queues", "bindings"} {
			e.db.Exec(`DROP TABLE IF EXISTS ` + e.prefix + tbl)
		}
		for _, db := range e.dbs {
			if sqlDB, err := db.DB(); err == nil {
				_ = sqlDB.Close()
			}
		}
	})
	return e
}

// open opens another pool on the database, as another process would.
func (e *pgEnv) open(t testing.TB) *gorm.DB {
	t.Helper()
	db, err := postgresdb.Open(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	e.dbs = append(e.dbs, db)
	return db
}

// options selects the PostgreSQL transport on db, with the endpoints
// declare declares in its block; the inbox and outbox default to the same
// database.
func (e *pgEnv) options(db *gorm.DB, declare func(*endpoint.Endpoints), more ...bus.Option) []bus.Option {
	return append([]bus.Option{
		quiet(),
		bus.WithTransport(pgtransport.New(db, func(c *pgtransport.Config) {
			c.TablePrefix = e.prefix
			declare(&c.Endpoints)
		})),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = e.prefix }),
	}, more...)
}

// rows returns the headers and body of the rows waiting in queue.
func (e *pgEnv) rows(t *testing.T, queue string) (headers []map[string]string, bodies [][]byte) {
	t.Helper()
	rows, err := e.db.Raw(`SELECT metadata::text, payload FROM `+e.prefix+`queue_messages WHERE queue = ? ORDER BY id`, queue).Rows()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var meta string
		var body []byte
		if err := rows.Scan(&meta, &body); err != nil {
			t.Fatal(err)
		}
		h := map[string]string{}
		if err := json.Unmarshal([]byte(meta), &h); err != nil {
			t.Fatal(err)
		}
		headers, bodies = append(headers, h), append(bodies, body)
	}
	return headers, bodies
}

func TestPostgresTransportRoundTripThroughTheBus(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	rec := newRecorder()
	typ := "PaymentReceived-" + env.suffix
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("payments-"+env.suffix, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("payments", rec), endpoint.AsMessageType(typ))
		})
	})...)
	if err := b.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "p1", Amount: 12.5}, bus.Headers{bus.HeaderMessageID: "pay-1", bus.HeaderCorrelationID: "corr-1", bus.HeaderMessageType: typ}); err != nil {
		t.Fatal(err)
	}
	// Through the outbox in a transaction, too.
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		return b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "p2", Amount: 1}, bus.Headers{bus.HeaderMessageID: "pay-2", bus.HeaderMessageType: typ})
	}); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 2)
	byID := map[string]seen{}
	for _, s := range got {
		byID[s.MessageID] = s
	}
	if s := byID["pay-1"]; s.CorrelationID != "corr-1" || s.Payment.PaymentID != "p1" || s.Payment.Amount != 12.5 || s.Type != typ {
		t.Errorf("pay-1 arrived as %+v", s)
	}
	if s := byID["pay-2"]; s.Payment.PaymentID != "p2" {
		t.Errorf("pay-2 arrived as %+v", s)
	}
	if b.DB() != env.db {
		t.Error("the inbox and outbox must default to the transport's database")
	}
}

func TestPostgresTransportFanOutToTwoEndpoints(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	rec := newRecorder()
	typ := "OrderPlaced-" + env.suffix
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		for _, name := range []string{"email", "audit"} {
			c.ReceiveEndpoint(name+"-"+env.suffix, func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, paymentConsumer(name, rec), endpoint.AsMessageType(typ))
			})
		}
	})...)
	// A second bus that consumes nothing publishes: the bindings table
	// routes its message to the first bus's endpoints.
	publisher := start(t, env.options(env.open(t), func(*endpoint.Endpoints) {})...)
	if err := publisher.Publish(context.Background(), PaymentReceived{PaymentID: "o1"}, bus.Headers{bus.HeaderMessageType: typ}); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 2)
	eps := map[string]int{}
	for _, s := range got {
		eps[s.Endpoint]++
	}
	if eps["email"] != 1 || eps["audit"] != 1 {
		t.Errorf("fan-out reached %v, want email and audit once each", eps)
	}
	drainPg(t, b)
	if n := len(rec.snapshot()); n != 2 {
		t.Errorf("consumed %d times, want 2", n)
	}
}

// drainPg waits until the bus has handled what it was given.
func drainPg(t *testing.T, b *bus.Bus) {
	t.Helper()
	stable := 0
	waitFor(t, func() bool {
		if b.Stats().InFlight == 0 {
			stable++
		} else {
			stable = 0
		}
		return stable >= 20
	})
}

func TestPostgresTransportConcurrentMessageLimitRunsInParallel(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	typ := "Work-" + env.suffix
	const limit = 4
	var inFlight, peak, done atomic.Int32
	reached := make(chan struct{})
	var once sync.Once
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("parallel-"+env.suffix, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = limit
			e.PrefetchCount = limit
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				n := inFlight.Add(1)
				defer inFlight.Add(-1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				if n == limit {
					once.Do(func() { close(reached) })
				}
				// Hold until all handlers run at once (or give up).
				select {
				case <-reached:
				case <-time.After(10 * time.Second):
				}
				done.Add(1)
				return nil
			}, endpoint.ForTypes(typ))
		})
	})...)
	for i := range 2 * limit {
		if err := b.Publish(context.Background(), bus.Raw{Type: typ, Body: []byte(fmt.Sprint(i))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatalf("never %d handlers at once; peak %d", limit, peak.Load())
	}
	waitFor(t, func() bool { return done.Load() == 2*limit })
	if p := peak.Load(); p != limit {
		t.Errorf("peak concurrency %d, want exactly %d", p, limit)
	}
}

func TestPostgresTransportRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	typ := "Charge-" + env.suffix
	ep := "charges-" + env.suffix
	var attempts atomic.Int32
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(2)
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				attempts.Add(1)
				return errors.New("card declined")
			}, endpoint.ForTypes(typ))
		})
	})...)
	body := []byte{0xff, 0x00, 0xfe} // not JSON, not UTF-8: bytes travel as they are
	if err := b.Publish(context.Background(), bus.Raw{Type: typ, Body: body}, bus.Headers{bus.HeaderMessageID: "charge-1", bus.HeaderCorrelationID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	var headers []map[string]string
	var bodies [][]byte
	waitFor(t, func() bool { headers, bodies = env.rows(t, ep+"_error"); return len(headers) == 1 })
	h := headers[0]
	// The counter moves once the dead letter is confirmed, just after the row appears.
	waitFor(t, func() bool { return b.Stats().DeadLettered == 1 })
	if attempts.Load() != 3 || b.Stats().DeadLettered != 1 {
		t.Errorf("attempts %d, stats %+v; want 3 attempts (1 + 2 retries) and 1 dead letter", attempts.Load(), b.Stats())
	}
	for k, want := range map[string]string{
		bus.HeaderFaultAttempts: "3", bus.HeaderFaultEndpoint: ep, "BW-Fault-Exchange": typ,
		bus.HeaderMessageID: "charge-1", bus.HeaderCorrelationID: "c-1", bus.HeaderMessageType: typ,
		"BW-Destination": "queue:" + ep + "_error",
	} {
		if h[k] != want {
			t.Errorf("dead letter header %s = %q, want %q", k, h[k], want)
		}
	}
	if !strings.Contains(h[bus.HeaderFaultReason], "card declined") || h[bus.HeaderFaultType] == "" || h["BW-Fault-Time"] == "" {
		t.Errorf("fault headers: %v", h)
	}
	if string(bodies[0]) != string(body) {
		t.Errorf("dead-lettered body %x, want %x", bodies[0], body)
	}
	waitFor(t, func() bool { hs, _ := env.rows(t, ep); return len(hs) == 0 })
}

func TestPostgresTransportInboxDedupSameIDThreeTimes(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	rec := newRecorder()
	typ := "Payment-" + env.suffix
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("ledger-"+env.suffix, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 4
			endpoint.Consumer(e, paymentConsumer("ledger", rec), endpoint.AsMessageType(typ))
		})
	})...)
	for range 3 {
		if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p", Amount: 1}, bus.Headers{bus.HeaderMessageID: "dup-" + env.suffix, bus.HeaderMessageType: typ}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { s := b.Stats(); return s.Consumed+s.Duplicates == 3 })
	drainPg(t, b)
	if n := len(rec.snapshot()); n != 1 {
		t.Errorf("consumer ran %d times for one message id published 3 times", n)
	}
	if d := b.Stats().Duplicates; d != 2 {
		t.Errorf("duplicates = %d, want 2", d)
	}
	if processedEntries(t, b, "dup-"+env.suffix) != 1 {
		t.Error("want one processed inbox entry")
	}
}

func TestPostgresTransportTwoBusInstancesCompete(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	typ := "Job-" + env.suffix
	ep := "jobs-" + env.suffix
	const n = 200
	var (
		mu    sync.Mutex
		count = map[string]int{}
		per   = map[string]int{}
	)
	declare := func(instance string) func(*endpoint.Endpoints) {
		return func(c *endpoint.Endpoints) {
			c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = 4
				// No deduplication: every delivery runs the consumer, so a
				// message handed to both instances would be counted twice.
				e.Inbox = endpoint.InboxOff
				endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
					mu.Lock()
					count[d.MessageID]++
					per[instance]++
					mu.Unlock()
					time.Sleep(2 * time.Millisecond)
					return nil
				}, endpoint.ForTypes(typ))
			})
		}
	}
	a := start(t, env.options(env.db, declare("a"), bus.WithInstanceID("a"))...)
	b := start(t, env.options(env.open(t), declare("b"), bus.WithInstanceID("b"))...)
	for i := range n {
		pub := a
		if i%2 == 1 {
			pub = b
		}
		if err := pub.Publish(context.Background(), bus.Raw{Type: typ, Body: []byte("{}")}, bus.Headers{bus.HeaderMessageID: fmt.Sprintf("job-%03d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for a.Stats().Consumed+b.Stats().Consumed < n {
		if time.Now().After(deadline) {
			t.Fatalf("consumed %d of %d within 60s", a.Stats().Consumed+b.Stats().Consumed, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	drainPg(t, a)
	drainPg(t, b)
	mu.Lock()
	defer mu.Unlock()
	for id, c := range count {
		if c != 1 {
			t.Errorf("%s consumed %d times", id, c)
		}
	}
	if len(count) != n || per["a"] == 0 || per["b"] == 0 {
		t.Errorf("consumed %d distinct of %d; instance a %d, b %d (both must take part)", len(count), n, per["a"], per["b"])
	}
}

func TestPostgresTransportPublishTxWithoutRelayHop(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	rec := newRecorder()
	typ := "Invoice-" + env.suffix
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("invoices-"+env.suffix, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("invoices", rec), endpoint.AsMessageType(typ))
		})
	})...)
	ctx := context.Background()
	_ = b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "gone"}, bus.Headers{bus.HeaderMessageType: typ}); err != nil {
			t.Fatal(err)
		}
		return errors.New("roll back")
	})
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		return b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "kept"}, bus.Headers{bus.HeaderMessageID: "inv-1", bus.HeaderMessageType: typ})
	}); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 1)
	drainPg(t, b)
	if len(rec.snapshot()) != 1 || got[0].Payment.PaymentID != "kept" {
		t.Fatalf("consumed %+v; want only the committed message", rec.snapshot())
	}
	st, err := b.OutboxStore().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending+deliveredRows(t, b.OutboxStore())+st.Parked != 0 {
		// bus.route still writes an outbox row; see docs/transports.md,
		// "Publishing from a transaction", for the change that removes it.
		t.Fatalf("PublishTx went through the outbox (%+v): bus/publish.go does not call the transport's DeliverTx yet", st)
	}
}

func TestPostgresTransportOptionValidation(t *testing.T) {
	t.Parallel()
	sqlite, err := gormstore.OpenSQLite("")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gormstore.Close(sqlite) }()
	pg := func(configure func(c *pgtransport.Config)) bus.Option {
		return bus.WithTransport(pgtransport.New(pgDialectOnly(t), configure))
	}
	// endpointWith declares an endpoint, with a consumer, that sets what
	// configure sets.
	endpointWith := func(configure func(e *endpoint.Endpoint)) func(c *pgtransport.Config) {
		return func(c *pgtransport.Config) {
			c.ReceiveEndpoint("refused", func(e *endpoint.Endpoint) {
				configure(e)
				endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil })
			})
		}
	}
	cases := map[string]struct {
		opts []bus.Option
		want string
	}{
		"nil db":      {[]bus.Option{bus.WithTransport(pgtransport.New(nil, nil))}, "pgtransport: db is nil"},
		"sqlite db":   {[]bus.Option{bus.WithTransport(pgtransport.New(sqlite, nil))}, `pgtransport: db is "sqlite"`},
		"bad prefix":  {[]bus.Option{pg(func(c *pgtransport.Config) { c.TablePrefix = "bad-prefix" })}, "bad-prefix"},
		"twice":       {[]bus.Option{pg(nil), pg(nil)}, "WithTransport given twice"},
		"and rabbit":  {[]bus.Option{bus.WithTransport(rabbitmq.New("amqp://localhost", nil)), pg(nil)}, "WithTransport given twice"},
		"short lease": {[]bus.Option{pg(func(c *pgtransport.Config) { c.Lease = time.Millisecond })}, "Lease 1ms is too short"},
		// RabbitMQ-only settings: refused, not silently ignored.
		"queue settings": {[]bus.Option{pg(endpointWith(func(e *endpoint.Endpoint) { e.Queue.DeadLetterExchange = "dlx" }))}, `pgtransport: endpoint "refused" sets Queue`},
		"routing key":    {[]bus.Option{pg(endpointWith(func(e *endpoint.Endpoint) { e.Bind("orders", "eu.*") }))}, `pgtransport: endpoint "refused" binds exchange "orders"`},
	}
	for name, tc := range cases {
		if _, err := bus.New(tc.opts...); !errors.Is(err, bus.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want ErrInvalidOption saying %q", name, err, tc.want)
		}
	}
	if _, err := bus.New(pg(endpointWith(func(e *endpoint.Endpoint) { e.Bind("orders", "") }))); err != nil {
		t.Errorf("a plain binding: New = %v; want it accepted", err)
	}
}

// TestPostgresTransportDropConnectionUnsupported: the PostgreSQL transport
// has no connection to drop; bus.DropConnection says so with an error
// wrapping transport.ErrDropUnsupported, and the bus keeps running.
func TestPostgresTransportDropConnectionUnsupported(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	b := start(t, env.options(env.db, func(*endpoint.Endpoints) {})...)
	if err := b.DropConnection(); !errors.Is(err, transport.ErrDropUnsupported) {
		t.Fatalf("DropConnection = %v; want transport.ErrDropUnsupported", err)
	}
	if err := b.Health(t.Context()); err != nil {
		t.Fatalf("Health after the refused drop: %v", err)
	}
}

// pgDialectOnly returns a *gorm.DB with the PostgreSQL dialect that never
// connects (New does no I/O).
func pgDialectOnly(t *testing.T) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(postgres.Open("host=127.0.0.1 port=1 user=nobody dbname=none sslmode=disable"), &gorm.Config{DisableAutomaticPing: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})
	return db
}

func TestPostgresTransportConsumerPublishesInItsTransaction(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	first, next := "Placed-"+env.suffix, "Audited-"+env.suffix
	rec := newRecorder()
	var calls atomic.Int32
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("orders-"+env.suffix, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				if err := d.Publish(ctx, bus.Raw{Type: next, Body: []byte(fmt.Sprint(calls.Load()))}, nil); err != nil {
					return err
				}
				if calls.Add(1) == 1 {
					return errors.New("fail after publishing: the publish must roll back")
				}
				return nil
			}, endpoint.ForTypes(first))
		})
		c.ReceiveEndpoint("audit-"+env.suffix, func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				rec.add(seen{Endpoint: "audit", MessageID: d.MessageID, CorrelationID: d.CorrelationID, Headers: map[string]string{"body": string(d.Body)}})
				return nil
			}, endpoint.ForTypes(next))
		})
	})...)
	if err := b.Publish(context.Background(), bus.Raw{Type: first, Body: []byte("{}")}, bus.Headers{bus.HeaderMessageID: "order-1", bus.HeaderCorrelationID: "corr-9"}); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 1)
	drainPg(t, b)
	if n := len(rec.snapshot()); n != 1 || got[0].Headers["body"] != "1" {
		t.Fatalf("audit got %+v; want exactly the second attempt's message", rec.snapshot())
	}
	if got[0].CorrelationID != "corr-9" {
		t.Errorf("correlation id %q, want the consumed message's corr-9", got[0].CorrelationID)
	}
}

// BenchmarkPostgresTransportPublishConsume measures publish→consume through
// the bus: 8 goroutines call Publish (outside a transaction, so each is a
// direct Deliver: on PostgreSQL one INSERT + NOTIFY, committed) while an
// endpoint with ConcurrentMessageLimit 8 and the default two-phase inbox
// consumes with a no-op consumer. msgs/s is messages consumed per second of
// wall time, from the first publish to the last consume. The inbox and
// outbox are in PostgreSQL for every transport, so only the transport
// differs between the sub-benchmarks (rabbitmq runs when
// BAREWIRE_TEST_AMQP_URL is set).
func BenchmarkPostgresTransportPublishConsume(b *testing.B) {
	b.Run("transport=postgres", func(b *testing.B) {
		env := newPgEnv(b)
		benchPublishConsume(b, "Bench-"+env.suffix, func(declare func(*endpoint.Endpoints)) []bus.Option {
			return env.options(env.db, declare)
		})
	})
	b.Run("transport=in-process", func(b *testing.B) {
		env := newPgEnv(b)
		benchPublishConsume(b, "Bench-"+env.suffix, func(declare func(*endpoint.Endpoints)) []bus.Option {
			return []bus.Option{quiet(), inprocEndpoints(declare), bus.WithDatabase(env.db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = env.prefix })}
		})
	})
	b.Run("transport=rabbitmq", func(b *testing.B) {
		if os.Getenv(testenv.AMQPVar) == "" {
			b.Skipf("set %s to compare with RabbitMQ", testenv.AMQPVar)
		}
		url := testenv.AMQPURL(b)
		env := newPgEnv(b)
		typ, queue := "Bench-"+env.suffix, "bench-"+env.suffix
		b.Cleanup(func() {
			conn, err := amqp.Dial(url)
			if err != nil {
				return
			}
			defer conn.Close()
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(queue, false, false, false)
				_, _ = ch.QueueDelete(queue+"_error", false, false, false)
				_ = ch.ExchangeDelete(typ, false, false)
				_ = ch.Close()
			}
		})
		benchPublishConsume(b, typ, func(declare func(*endpoint.Endpoints)) []bus.Option {
			return []bus.Option{quiet(), bus.WithTransport(rabbitmq.New(url, func(c *rabbitmq.Config) { declare(&c.Endpoints) })),
				bus.WithDatabase(env.db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = env.prefix })}
		})
	})
}

func benchPublishConsume(b *testing.B, typ string, options func(declare func(*endpoint.Endpoints)) []bus.Option) {
	var consumed sync.WaitGroup
	consumed.Add(b.N)
	bs, err := bus.New(options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(strings.Replace(typ, "Bench-", "bench-", 1), func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 8
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				consumed.Done()
				return nil
			}, endpoint.ForTypes(typ))
		})
	})...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := bs.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = bs.Stop(ctx) }()
	body := []byte(`{"orderId":"12345","amount":42.5,"currency":"EUR"}`)
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := bs.Publish(ctx, bus.Raw{Type: typ, Body: body}, nil); err != nil {
					b.Error(err)
					consumed.Done() // never coming
				}
			}
		})
	}
	wg.Wait()
	all := make(chan struct{})
	go func() { consumed.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("not every message consumed within 5 minutes: %+v", bs.Stats())
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// InvoiceRaised is the message of the PostgreSQL transport example.
type InvoiceRaised struct {
	InvoiceID string  `json:"invoiceId"`
	Total     float64 `json:"total"`
}

// A service with PostgreSQL only: the transport, the inbox and the outbox
// share one database.
func ExampleWithTransport_postgres() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// snippet:start postgres-transport
	db, err := postgresdb.Open("host=127.0.0.1 user=app dbname=app sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	b, err := bus.New(
		bus.WithTransport(pgtransport.New(db, func(c *pgtransport.Config) {
			// Endpoints are declared exactly as on RabbitMQ or in process.
			c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = 4 // four competing consumers in this process
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceRaised]) error {
					// Writes through bus.TxFromContext(ctx) commit together
					// with the inbox entry and with what the consumer publishes.
					return bus.TxFromContext(ctx).Exec("UPDATE invoices SET billed = true WHERE id = ?", c.Message.InvoiceID).Error
				})
			})
		})),
		// Optional: the inbox/outbox options (and table prefix) as usual.
		bus.WithOutbox(func(o *outbox.Options) { o.InboxRetention = 72 * time.Hour }),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Run(ctx); err != nil {
		log.Fatal(err)
	}
	// snippet:end postgres-transport
}

// TestPostgresTransportDelayedRedelivery: a failed message waits in its
// endpoint's queue, invisible for the configured delay (a row operators can
// see with psql), does not hold up the messages behind it, and comes back
// with its redelivery count until it succeeds.
func TestPostgresTransportDelayedRedelivery(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	typ := "Later-" + env.suffix
	ep := "later-" + env.suffix
	const delay1, delay2 = 1500 * time.Millisecond, 300 * time.Millisecond
	type call struct {
		id, count string
		at        time.Time
	}
	calls := make(chan call, 10)
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.NoRetry()
			e.Redelivery = []time.Duration{delay1, delay2}
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				n := d.Headers[bus.HeaderRedeliveryCount]
				calls <- call{id: d.MessageID, count: n, at: time.Now()}
				if d.MessageID == "slow-1" && n != "2" {
					return fmt.Errorf("not yet (redelivery %q)", n)
				}
				return nil
			}, endpoint.ForTypes(typ))
		})
	})...)
	ctx := context.Background()
	if err := b.Publish(ctx, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "slow-1"}); err != nil {
		t.Fatal(err)
	}
	first := <-calls
	if first.id != "slow-1" || first.count != "" {
		t.Fatalf("first call %+v", first)
	}
	// While it waits, the message is an outbox row for the endpoint's
	// queue that is not available yet, carrying its redelivery count; the
	// queue itself is empty (the original was acked).
	waitFor(t, func() bool {
		var n int64
		env.db.Raw(`SELECT count(*) FROM `+env.prefix+`outbox WHERE destination = ? AND status = 'pending' AND available_at > now() AND headers->>'BW-Redelivery-Count' = '1'`, "queue:"+ep).Scan(&n)
		hs, _ := env.rows(t, ep)
		return n == 1 && len(hs) == 0
	})
	// A message published now is not held up behind it.
	if err := b.Publish(ctx, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "fast-1"}); err != nil {
		t.Fatal(err)
	}
	if c := <-calls; c.id != "fast-1" {
		t.Fatalf("second call %+v; want fast-1 before slow-1 comes back", c)
	}
	second, third := <-calls, <-calls
	if second.id != "slow-1" || second.count != "1" || third.id != "slow-1" || third.count != "2" {
		t.Fatalf("redeliveries %+v %+v", second, third)
	}
	if gap := second.at.Sub(first.at); gap < delay1 {
		t.Errorf("first redelivery after %v, want at least %v", gap, delay1)
	}
	if gap := third.at.Sub(second.at); gap < delay2 {
		t.Errorf("second redelivery after %v, want at least %v", gap, delay2)
	}
	drainPg(t, b)
	if s := b.Stats(); s.Redelivered != 2 || s.DeadLettered != 0 {
		t.Errorf("stats %+v; want 2 delayed redeliveries, no dead letter", s)
	}
	waitFor(t, func() bool { hs, _ := env.rows(t, ep); return len(hs) == 0 })
}

func TestPostgresTransportRedeliveryExhaustedDeadLetters(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	typ := "Hopeless-" + env.suffix
	ep := "hopeless-" + env.suffix
	var attempts atomic.Int32
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			e.Redelivery = []time.Duration{50 * time.Millisecond}
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				attempts.Add(1)
				return errors.New("still broken")
			}, endpoint.ForTypes(typ))
		})
	})...)
	if err := b.Publish(context.Background(), bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "hopeless-1"}); err != nil {
		t.Fatal(err)
	}
	var headers []map[string]string
	waitFor(t, func() bool { headers, _ = env.rows(t, ep+"_error"); return len(headers) == 1 })
	h := headers[0]
	if h[bus.HeaderRedeliveryCount] != "1" || h[bus.HeaderFaultAttempts] != "2" || !strings.Contains(h[bus.HeaderFaultReason], "still broken") {
		t.Errorf("dead letter headers %v; want one redelivery, then 2 attempts, with the reason", h)
	}
	waitFor(t, func() bool { return b.Stats().DeadLettered == 1 })
	if n := attempts.Load(); n != 4 {
		t.Errorf("%d attempts, want 4 (2 per delivery, 2 deliveries)", n)
	}
	waitFor(t, func() bool { hs, _ := env.rows(t, ep); return len(hs) == 0 })
}

// On the PostgreSQL transport a message published in a transaction has no
// outbox row and no relay: its publish span says so, and it counts as
// published when the transport sees the transaction commit (a rolled-back
// one never counts).
func TestPostgresTransportPublishTxTelemetry(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	typ := "Counted-" + env.suffix
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	rec := newRecorder()
	b := start(t, env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("counted-"+env.suffix, func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				rec.add(seen{MessageID: d.MessageID})
				return nil
			}, endpoint.ForTypes(typ))
		})
	}, bus.WithTracerProvider(tp), bus.WithMeterProvider(mp))...)
	ctx := context.Background()
	publish := func(id string, commit bool) {
		err := b.Transaction(ctx, func(tx *gorm.DB) error {
			if err := b.PublishTx(ctx, tx, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
				return err
			}
			if !commit {
				return errors.New("roll back")
			}
			return nil
		})
		if commit && err != nil {
			t.Fatal(err)
		}
	}
	publish("rolled-back", false)
	publish("committed-1", true)
	publish("committed-2", true)
	rec.wait(t, 2)
	published := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		n, _ := metricTotal(t, rm, "barewire.messages.published", attribute.String("message_type", typ))
		return n // the commit watcher reports the commits shortly after them
	}
	waitFor(t, func() bool { return published() == 2 })
	for _, s := range exp.GetSpans() {
		if s.Name != typ+" publish" {
			continue
		}
		for _, kv := range s.Attributes {
			if kv.Key == "barewire.outbox" && kv.Value.AsBool() {
				t.Errorf("span %s says barewire.outbox=true; the message was written to the queue in the transaction", s.Name)
			}
		}
	}
	if got := published(); got != 2 {
		t.Errorf("published counter %d, want 2 (the rolled-back message never counts)", got)
	}
}

// On the PostgreSQL transport the consumer's transaction also deletes the
// message's row (the ack commits with the effects): every message is
// consumed once, the queue ends empty, and the transport's own ack finds
// nothing left to do without mistaking that for a lost lease.
func TestPostgresTransportAcksInTheConsumersTransaction(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	typ := "AckedInTx-" + env.suffix
	ep := "acked-in-tx-" + env.suffix
	var logs syncBuffer
	rec := newRecorder()
	b := start(t, append(env.options(env.db, func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 4
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				rec.add(seen{MessageID: d.MessageID})
				return nil
			}, endpoint.ForTypes(typ))
		})
	}), bus.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))...)
	const n = 40
	for i := range n {
		if err := b.Publish(context.Background(), bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: fmt.Sprintf("ack-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	rec.wait(t, n)
	drainPg(t, b)
	waitFor(t, func() bool { hs, _ := env.rows(t, ep); return len(hs) == 0 })
	if got := len(rec.snapshot()); got != n {
		t.Errorf("%d deliveries handled, want %d", got, n)
	}
	if strings.Contains(logs.String(), "lease lost") {
		t.Errorf("the transport's ack took the in-transaction ack for a lost lease:\n%s", logs.String())
	}
}

// TestPostgresTransportRelayOnAPoolOfRelayWorkers: on the PostgreSQL
// transport the relay's deliveries take connections of the pool the outbox
// uses, so its batches are leased rather than held in open transactions: a
// held batch keeps a connection while its delivery waits for another, and
// with a pool no larger than RelayWorkers beyond the connections taken for
// good every worker would wait until RelayLease ran out. Here the pool has
// four connections: one for the outbox's LISTEN, one for the transport's,
// and RelayWorkers (2) more; the relay must send every row well within the
// lease.
func TestPostgresTransportRelayOnAPoolOfRelayWorkers(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	db := env.open(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(4)
	st, err := gormstore.New(db, gormstore.WithTablePrefix(env.prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Rows committed before the bus starts: its relay finds 300 at once,
	// three batches for its two workers.
	msgs := make([]*outbox.Message, 300)
	for i := range msgs {
		msgs[i] = &outbox.Message{MessageID: fmt.Sprintf("pool-%d", i), Destination: "exchange:Unbound-" + env.suffix,
			MessageType: "Unbound-" + env.suffix, ContentType: "application/json", Payload: []byte(`{}`)}
	}
	if err := db.Transaction(func(tx *gorm.DB) error { return st.Outbox().Add(gormstore.WithTx(ctx, tx), msgs) }); err != nil {
		t.Fatal(err)
	}
	start(t, env.options(db, func(*endpoint.Endpoints) {},
		bus.WithOutbox(func(o *outbox.Options) { o.RelayWorkers = 2; o.RelayLease = time.Minute }))...)
	// Counted through another pool: a stalled relay may hold all of db's.
	check, err := gormstore.New(env.db, gormstore.WithTablePrefix(env.prefix))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := check.Outbox().Stats(ctx)
		if err == nil && s.Pending == 0 && deliveredRows(t, check.Outbox()) == int64(len(msgs)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox after 20s: %+v (%v); want all %d rows delivered", s, err, len(msgs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
