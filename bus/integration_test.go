package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// realEnv is one test's share of the real services: a unique name suffix,
// a PostgreSQL handle with its own table prefix, and an AMQP connection for
// looking at the broker directly.
type realEnv struct {
	suffix string
	url    string
	db     *gorm.DB
	prefix string
	conn   *amqp.Connection
	queues []string
	exchs  []string
	tables []string
}

func newRealEnv(t *testing.T) *realEnv {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	url := testenv.AMQPURL(t)
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	e := &realEnv{suffix: s, url: url, db: db, prefix: "bt_" + s + "_", conn: conn}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err == nil {
			for _, q := range e.queues {
				_, _ = ch.QueueDelete(q, false, false, false)
				_, _ = ch.QueueDelete(q+"_error", false, false, false)
			}
			for _, x := range e.exchs {
				_ = ch.ExchangeDelete(x, false, false)
			}
			_ = ch.Close()
		}
		_ = conn.Close()
		for _, tbl := range []string{"inbox", "outbox"} {
			db.Exec(`DROP TABLE IF EXISTS "` + e.prefix + tbl + `"`)
		}
		for _, tbl := range e.tables {
			db.Exec(`DROP TABLE IF EXISTS "` + tbl + `"`)
		}
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return e
}

// q returns a queue (endpoint) name unique to this test and remembers it for cleanup.
func (e *realEnv) q(name string) string {
	n := name + "-" + e.suffix
	e.queues = append(e.queues, n)
	return n
}

// typ returns a message type name unique to this test (its exchange is cleaned up).
func (e *realEnv) typ(name string) string {
	n := name + "-" + e.suffix
	e.exchs = append(e.exchs, n)
	return n
}

// options selects RabbitMQ with the endpoints declare declares in its
// block, and keeps the inbox and outbox in e's tables on PostgreSQL.
func (e *realEnv) options(declare func(*endpoint.Endpoints), more ...func(*outbox.Options)) []bus.Option {
	return []bus.Option{
		quiet(),
		bus.WithTransport(rabbitmq.New(e.url, func(c *rabbitmq.Config) { declare(&c.Endpoints) })),
		bus.WithDatabase(e.db),
		bus.WithOutbox(func(o *outbox.Options) {
			o.TablePrefix = e.prefix
			for _, f := range more {
				f(o)
			}
		}),
	}
}

func TestRabbitPostgresRoundTripAndDedup(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("PaymentReceived")
	rec := newRecorder()
	email, auditQ := env.q("email"), env.q("audit")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		for _, name := range []string{email, auditQ} {
			c.ReceiveEndpoint(name, func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, paymentConsumer(name, rec), endpoint.AsMessageType(typ))
			})
		}
	})...)
	ctx := context.Background()
	h := bus.Headers{bus.HeaderMessageID: "pay-" + env.suffix, bus.HeaderCorrelationID: "corr-1", bus.HeaderMessageType: typ}
	for i := 0; i < 3; i++ {
		if err := b.Publish(ctx, PaymentReceived{PaymentID: "p", Amount: 1}, h); err != nil {
			t.Fatal(err)
		}
	}
	got := rec.wait(t, 2)
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed+s.Duplicates >= 6 })
	if n := len(rec.snapshot()); n != 2 {
		t.Fatalf("consumers ran %d times for one message id on two endpoints; want 2", n)
	}
	for _, s := range got {
		if s.MessageID != "pay-"+env.suffix || s.CorrelationID != "corr-1" {
			t.Errorf("lost id or correlation over RabbitMQ: %+v", s)
		}
	}
	if d := b.Stats().Duplicates; d != 4 {
		t.Errorf("duplicates absorbed = %d, want 4", d)
	}
}

func TestRabbitConcurrentMessageLimitRunsInParallel(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("Work")
	const limit = 8
	var inFlight, peak atomic.Int32
	reached := make(chan struct{})
	var once sync.Once
	var done atomic.Int32
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(env.q("parallel"), func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = limit
			e.PrefetchCount = limit * 2
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				cur := inFlight.Add(1)
				defer inFlight.Add(-1)
				for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
				}
				if cur == limit {
					once.Do(func() { close(reached) })
				}
				select { // hold the slot until all 8 run at once (or give up)
				case <-reached:
				case <-time.After(5 * time.Second):
				}
				done.Add(1)
				return nil
			}, endpoint.AsMessageType(typ))
		})
	})...)
	for i := 0; i < limit*2; i++ {
		if err := b.Publish(context.Background(), PaymentReceived{PaymentID: fmt.Sprint(i)}, bus.Headers{bus.HeaderMessageType: typ}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatalf("peak concurrency %d; want %d handlers at once", peak.Load(), limit)
	}
	waitFor(t, func() bool { return done.Load() == limit*2 })
	if p := peak.Load(); p > limit {
		t.Fatalf("peak concurrency %d exceeds the limit %d", p, limit)
	}
}

func TestRabbitPlainAMQPPublisherConsumedAndDeduplicated(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	got := make(chan *endpoint.Delivery, 4)
	var calls atomic.Int32
	q := env.q("interop")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				calls.Add(1)
				got <- d
				return nil
			})
		})
	})...)
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for i := 0; i < 2; i++ { // the same message twice, as a plain client retrying
		err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
			MessageId: "plain-1", ContentType: "text/plain", Body: []byte("hello"),
			Headers: amqp.Table{"x-custom": "v", "x-number": int64(7)}, DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var d *endpoint.Delivery
	select {
	case d = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("plain AMQP message not consumed")
	}
	if d.MessageID != "plain-1" || string(d.Body) != "hello" || d.Headers["x-custom"] != "v" || d.Headers["x-number"] != "7" {
		t.Errorf("delivery = id %q body %q headers %v", d.MessageID, d.Body, d.Headers)
	}
	waitStats(t, b, func(s bus.Stats) bool { return s.Duplicates == 1 })
	if c := calls.Load(); c != 1 {
		t.Fatalf("consumer ran %d times for one message id", c)
	}
}

func TestRabbitPoisonMessageReachesErrorQueueWithFaultHeaders(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("Poison")
	q := env.q("poison")
	var calls atomic.Int32
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Interval(2, 20*time.Millisecond)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				calls.Add(1)
				return errors.New("always fails")
			}, endpoint.AsMessageType(typ))
		})
	})...)
	if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "x"}, bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: "poison-1"}); err != nil {
		t.Fatal(err)
	}
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var msg amqp.Delivery
	waitFor(t, func() bool {
		m, ok, err := ch.Get(q+"_error", true)
		if err != nil {
			t.Fatal(err)
		}
		msg = m
		return ok
	})
	if msg.MessageId != "poison-1" || msg.Type != typ {
		t.Errorf("error queue message id %q type %q", msg.MessageId, msg.Type)
	}
	if r, _ := msg.Headers[bus.HeaderFaultReason].(string); !strings.Contains(r, "always fails") {
		t.Errorf("fault reason = %v", msg.Headers)
	}
	if a, _ := msg.Headers[bus.HeaderFaultAttempts].(string); a != "3" || calls.Load() != 3 {
		t.Errorf("attempts header %q, calls %d; want 3 (1 + 2 retries)", a, calls.Load())
	}
	if ex, _ := msg.Headers["BW-Fault-Exchange"].(string); ex != typ {
		t.Errorf("original exchange header = %q, want %q", ex, typ)
	}
}

func TestRabbitPublishTxRollbackSendsNothing(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("Transfer")
	rec := newRecorder()
	q := env.q("transfers")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer(q, rec), endpoint.AsMessageType(typ))
		})
	})...)
	ctx := context.Background()
	h := func(id string) bus.Headers { return bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: id} }
	_ = env.db.Transaction(func(tx *gorm.DB) error {
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "rolled-back"}, h("rb")); err != nil {
			t.Error(err)
		}
		return errors.New("roll back")
	})
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		return b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "committed"}, h("ok"))
	}); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 1)
	if got[0].Payment.PaymentID != "committed" {
		t.Fatalf("got %+v", got[0])
	}
	// The row is marked after the broker's confirm, which can come after the
	// consumer already has the message.
	var st outbox.Stats
	waitFor(t, func() bool {
		var err error
		st, err = b.OutboxStore().Stats(ctx)
		return err == nil && st.Pending == 0
	})
	if deliveredRows(t, b.OutboxStore()) != 1 {
		t.Fatalf("outbox %+v; want exactly the committed row, delivered", st)
	}
}

// TestRabbitQuorumDelayedRedeliveryNoLoop runs an endpoint on a
// quorum queue whose consumer fails until its second delayed redelivery
// (each one an outbox row sent back to the queue): the broker's own
// headers (x-delivery-count) must not make it loop, and it must be
// processed exactly once.
func TestRabbitQuorumDelayedRedeliveryNoLoop(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("Quorum")
	q := env.q("quorum")
	var calls atomic.Int32
	headers := make(chan map[string]string, 1)
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.Queue.Type = endpoint.Quorum
			e.Retry = endpoint.NoRetry()
			e.Redelivery = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				calls.Add(1)
				if c.Headers["BW-Redelivery-Count"] != "2" {
					return errors.New("not yet")
				}
				headers <- c.Headers
				return nil
			}, endpoint.AsMessageType(typ))
		})
	})...)
	if err := b.Publish(context.Background(), PaymentReceived{}, bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: "q-1"}); err != nil {
		t.Fatal(err)
	}
	var h map[string]string
	select {
	case h = <-headers:
	case <-time.After(15 * time.Second):
		t.Fatalf("not processed after redeliveries; calls=%d stats=%+v", calls.Load(), b.Stats())
	}
	if h[bus.HeaderFaultReason] == "" {
		t.Errorf("redelivered without %s: %v", bus.HeaderFaultReason, h)
	}
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed == 1 })
	if c, s := calls.Load(), b.Stats(); c != 3 || s.Redelivered != 2 || s.DeadLettered != 0 {
		t.Fatalf("calls %d stats %+v; want 3 calls, 2 redeliveries", c, s)
	}
}
