package bus_test

// Liveness: every failure a consumer, a header or an id can cause ends in a
// terminal state (consumed once, dead-lettered with its reason) in bounded
// time, and a database outage pauses consumption instead of requeueing in a
// loop (issue 14).

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/tcpproxy"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// deadLetters collects what an error queue's consumer receives.
type deadLetters struct {
	ch chan *endpoint.Delivery
}

func newDeadLetters() *deadLetters { return &deadLetters{ch: make(chan *endpoint.Delivery, 64)} }

func (d *deadLetters) consumer(e *endpoint.Endpoint) {
	endpoint.RawConsumer(e, func(ctx context.Context, dl *endpoint.Delivery) error {
		d.ch <- dl
		return nil
	})
}

func (d *deadLetters) next(t *testing.T, within time.Duration, what string) *endpoint.Delivery {
	t.Helper()
	select {
	case dl := <-d.ch:
		return dl
	case <-time.After(within):
		t.Fatalf("%s: not dead-lettered within %v", what, within)
		return nil
	}
}

func httpError() error {
	_, err := (&http.Client{Timeout: time.Second}).Get("http://127.0.0.1:1/charge") // nothing listens on port 1
	return err
}

// TestConsumerErrorsAreTheConsumers: whatever a consumer returns is its own
// failure, whatever the error's Go type — a wrapped *url.Error or
// context.DeadlineExceeded satisfies net.Error, which the bus once took for
// a database outage and requeued forever.
func TestConsumerErrorsAreTheConsumers(t *testing.T) {
	t.Parallel()
	urlErr := httpError()
	var ue *url.Error
	if !errors.As(urlErr, &ue) {
		t.Fatalf("want a *url.Error from net/http, got %T %v", urlErr, urlErr)
	}
	cases := []struct {
		name     string
		err      error
		attempts int
	}{
		{"deadline", fmt.Errorf("charge: %w", context.DeadlineExceeded), 3},
		{"url", fmt.Errorf("charge: %w", urlErr), 3},
		{"permanent-deadline", endpoint.Permanent(fmt.Errorf("charge: %w", context.DeadlineExceeded)), 1},
		{"permanent-url", endpoint.Permanent(fmt.Errorf("charge: %w", urlErr)), 1},
		// The database is up: a bad-connection error from the consumer's own
		// call is its failure (a probe decides, not the error).
		{"badconn", fmt.Errorf("other db: %w", driver.ErrBadConn), 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dls := newDeadLetters()
			var calls atomic.Int32
			b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
				c.ReceiveEndpoint("charge", func(e *endpoint.Endpoint) {
					e.Retry = endpoint.Immediate(2)
					endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
						calls.Add(1)
						return tc.err
					})
				})
				c.ReceiveEndpoint("charge_error", dls.consumer)
			}))
			if err := b.Publish(context.Background(), PaymentReceived{PaymentID: tc.name}, nil); err != nil {
				t.Fatal(err)
			}
			dl := dls.next(t, 10*time.Second, tc.name)
			if got := dl.Headers[bus.HeaderFaultAttempts]; got != strconv.Itoa(tc.attempts) {
				t.Errorf("%s: %s = %s; want %d", tc.name, bus.HeaderFaultAttempts, got, tc.attempts)
			}
			if !strings.Contains(dl.Headers[bus.HeaderFaultReason], "charge") && tc.name != "badconn" {
				t.Errorf("%s: reason %q does not carry the consumer's error", tc.name, dl.Headers[bus.HeaderFaultReason])
			}
			if int(calls.Load()) != tc.attempts {
				t.Errorf("%s: consumer ran %d times; want %d", tc.name, calls.Load(), tc.attempts)
			}
			if s := b.Stats(); s.Requeued != 0 {
				t.Errorf("%s: requeued %d times; a consumer's failure is never requeued", tc.name, s.Requeued)
			}
		})
	}
}

// pgOutbox puts the inbox and outbox in env's tables on db.
func pgOutbox(env *pgEnv, db *gorm.DB, more ...func(*outbox.Options)) []bus.Option {
	return []bus.Option{bus.WithDatabase(db), bus.WithOutbox(func(o *outbox.Options) {
		o.TablePrefix = env.prefix
		for _, f := range more {
			f(o)
		}
	})}
}

// proxied opens a pool on env's database through a proxy that can cut it off.
func proxied(t *testing.T, env *pgEnv) (*gorm.DB, *tcpproxy.Proxy) {
	t.Helper()
	p, err := tcpproxy.New(testenv.PostgresAddr(env.dsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	direct := env.dsn
	env.dsn = testenv.PostgresDSNVia(direct, p.Addr())
	db := env.open(t)
	env.dsn = direct
	return db, p
}

// TestAbortedTransactionIsTheConsumersFailure: a consumer that ignores a
// failed statement leaves its PostgreSQL transaction aborted; the processed
// mark then fails with 25P02. That is the consumer's failure, retried and
// dead-lettered with that reason, not a database outage requeued forever.
func TestAbortedTransactionIsTheConsumersFailure(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	dls := newDeadLetters()
	var calls atomic.Int32
	b := start(t, append(pgOutbox(env, env.db), quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("aborts", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				calls.Add(1)
				_ = bus.TxFromContext(ctx).Exec("SELECT 1/0").Error // failed and ignored
				return nil
			})
		})
		c.ReceiveEndpoint("aborts_error", dls.consumer)
	}))...)
	if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	dl := dls.next(t, 15*time.Second, "aborted transaction")
	reason := dl.Headers[bus.HeaderFaultReason]
	if !strings.Contains(reason, "25P02") || !strings.Contains(reason, "error was ignored") {
		t.Errorf("reason %q; want the aborted-transaction reason", reason)
	}
	if calls.Load() != 2 || dl.Headers[bus.HeaderFaultAttempts] != "2" {
		t.Errorf("consumer ran %d times, attempts header %s; want 2 (one retry)", calls.Load(), dl.Headers[bus.HeaderFaultAttempts])
	}
	if s := b.Stats(); s.Requeued != 0 {
		t.Errorf("requeued %d times", s.Requeued)
	}
}

// TestLockLostIsNotAFailure: a delivery whose inbox lock expired and was
// taken over by a duplicate delivery cannot commit (ErrLockLost). That is
// not the consumer's failure: it must not use a retry or dead-letter a
// message the other delivery processed.
func TestLockLostIsNotAFailure(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	dls := newDeadLetters()
	secondStarted := make(chan struct{})
	var calls atomic.Int32
	b := start(t, append(pgOutbox(env, env.db, func(o *outbox.Options) { o.InboxLockTimeout = 500 * time.Millisecond }),
		quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
			c.ReceiveEndpoint("slow", func(e *endpoint.Endpoint) {
				e.Retry = endpoint.NoRetry()
				e.ConcurrentMessageLimit = 2
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
					switch calls.Add(1) {
					case 1: // outlives its lock: the duplicate takes it over
						select {
						case <-secondStarted:
						case <-time.After(10 * time.Second):
							return errors.New("the duplicate never took the lock over")
						}
					case 2:
						close(secondStarted)
					}
					return nil
				})
			})
			c.ReceiveEndpoint("slow_error", dls.consumer)
		}))...)
	h := bus.Headers{bus.HeaderMessageID: "lock-lost-1"}
	for range 2 {
		if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p"}, h); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { s := b.Stats(); return s.Consumed+s.Duplicates >= 2 })
	drain(t, b)
	if s := b.Stats(); s.DeadLettered != 0 || s.Retries != 0 || s.Consumed != 1 || s.Duplicates != 1 {
		t.Fatalf("stats %+v; want the lock loser to find the entry processed (1 consumed, 1 duplicate, no retry, no dead letter)", s)
	}
	if n := processedEntries(t, b, "lock-lost-1"); n != 1 {
		t.Fatalf("%d processed entries; want 1", n)
	}
}

// TestInboundBadIDsDeadLetteredAtOnce: ids PostgreSQL cannot store (NUL,
// invalid UTF-8: raw GUID bytes) or too long for an inbox key, sent by a
// plain AMQP client, are dead-lettered at once with the reason and a
// stand-in id; the good message beside them is consumed.
func TestInboundBadIDsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("PaymentReceived")
	q := env.q("badids")
	dls := newDeadLetters()
	good := make(chan string, 4)
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				good <- c.MessageID
				return nil
			}, endpoint.AsMessageType(typ))
		})
		c.ReceiveEndpoint(q+"_error", dls.consumer)
	})...)
	_ = b
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	bad := []string{"a\x00b", string([]byte{0x9f, 0x2c, 0xff, 0xfe, 0x11}), "caf\xe9-latin1"}
	body, _ := json.Marshal(PaymentReceived{PaymentID: "p", Amount: 1})
	for _, id := range append(bad, "good-"+env.suffix) {
		if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
			MessageId: id, Type: typ, ContentType: "application/json", Body: body, DeliveryMode: amqp.Persistent,
		}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for range bad {
		dl := dls.next(t, 15*time.Second, "a bad id")
		orig := dl.Headers[bus.HeaderFaultMessageID]
		if !strings.Contains(dl.Headers[bus.HeaderFaultReason], "cannot be deduplicated") || orig == "" {
			t.Errorf("dead letter %q: reason %q, original id %q", dl.MessageID, dl.Headers[bus.HeaderFaultReason], orig)
		}
		if !strings.HasPrefix(dl.MessageID, "bw-invalid-id-") || dl.Headers[bus.HeaderFaultAttempts] != "0" {
			t.Errorf("dead letter id %q attempts %s; want a stand-in id and 0 attempts", dl.MessageID, dl.Headers[bus.HeaderFaultAttempts])
		}
		seen[orig] = true
	}
	for _, id := range bad {
		if q := strconv.QuoteToASCII(id[:min(len(id), 96)]); !seen[q] {
			t.Errorf("no dead letter for %s (got %v)", q, seen)
		}
	}
	select {
	case id := <-good:
		if id != "good-"+env.suffix {
			t.Errorf("consumed %q", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the good message beside the bad ids was not consumed")
	}
}

// TestDatabaseOutagePausesConsumption: while PostgreSQL is unreachable the
// endpoints hold their deliveries unacknowledged and probe, instead of
// requeueing once a second: on a quorum queue with a delivery limit of 5,
// an outage longer than five seconds then drops nothing. One warning when
// the outage starts, one line when it ends, none per message.
// BAREWIRE_TEST_OUTAGE sets the outage (default 8s; the 60s run is
// in docs/guarantees.md).
func TestDatabaseOutagePausesConsumption(t *testing.T) {
	t.Parallel()
	outage := 8 * time.Second
	if v := os.Getenv("BAREWIRE_TEST_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("BAREWIRE_TEST_OUTAGE=%q: %v", v, err)
		}
		outage = d
	}
	const n = 40
	amqpEnv := newRealEnv(t)
	pg := newPgEnv(t)
	pgDB, proxy := proxied(t, pg)
	typ := amqpEnv.typ("PaymentReceived")
	q := amqpEnv.q("outage")
	logs := &syncBuffer{}
	var mu sync.Mutex
	effects := map[string]int{}
	b := start(t, append(pgOutbox(pg, pgDB),
		bus.WithLogger(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
		bus.WithTransport(rabbitmq.New(amqpEnv.url, func(c *rabbitmq.Config) {
			c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
				e.Queue.Type = endpoint.Quorum
				e.Queue.Args = map[string]any{"x-delivery-limit": 5}
				e.ConcurrentMessageLimit = 4
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
					mu.Lock()
					effects[c.MessageID]++
					mu.Unlock()
					return nil
				}, endpoint.AsMessageType(typ))
			})
		})),
	)...)
	ctx := context.Background()
	proxy.Down()
	cutAt := time.Now()
	for i := range n {
		if err := b.Publish(ctx, PaymentReceived{PaymentID: strconv.Itoa(i)}, bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: fmt.Sprintf("out-%s-%d", amqpEnv.suffix, i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { // the first delivery closes the gate
		for _, c := range b.CheckHealth(ctx).Checks {
			if c.Name == bus.HealthCheckDatabase && c.Status == "fail" && c.Details["consumptionPaused"] == true {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Until(cutAt.Add(outage))) // the outage itself: a duration, not a synchronisation
	proxy.Up()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := len(effects) == n
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("%d of %d messages processed 30s after a %v outage; stats %+v", len(effects), n, outage, b.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	drain(t, b)
	mu.Lock()
	for id, c := range effects {
		if c != 1 {
			t.Errorf("%s processed %d times", id, c)
		}
	}
	mu.Unlock()
	if s := b.Stats(); s.DeadLettered != 0 || s.Requeued != 0 {
		t.Errorf("stats %+v; an outage must neither dead-letter nor requeue", s)
	}
	ch, err := amqpEnv.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if qi, err := ch.QueueDeclarePassive(q+"_error", true, false, false, false, nil); err != nil || qi.Messages != 0 {
		t.Errorf("error queue: %+v %v; want empty", qi, err)
	}
	var paused, resumed, perMessage int
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		switch {
		case strings.Contains(l, "consumption paused"):
			paused++
		case strings.Contains(l, "consumption resumed"):
			resumed++
		case strings.Contains(l, `"message_id"`) && !strings.Contains(l, `"level":"DEBUG"`):
			perMessage++
		}
	}
	if paused != 1 || resumed != 1 || perMessage != 0 {
		t.Errorf("log lines: %d paused, %d resumed, %d per message; want 1, 1, 0", paused, resumed, perMessage)
	}
	t.Logf("outage %v: %d messages processed once after it; log lines paused=%d resumed=%d per-message=%d", outage, n, paused, resumed, perMessage)
}

// TestStopDuringDatabaseOutage: deliveries waiting for the database end
// when Stop begins (handed back to the broker), so Stop does not wait for
// the database to return.
func TestStopDuringDatabaseOutage(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	db, proxy := proxied(t, env)
	ran := make(chan struct{}, 1)
	b, err := bus.New(append(pgOutbox(env, db), quiet(), inprocEndpoint("stop-in-outage", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
			ran <- struct{}{}
			return nil
		})
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.Down()
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, c := range b.CheckHealth(ctx).Checks {
			if c.Name == bus.HealthCheckDatabase && c.Details["consumptionPaused"] == true {
				return true
			}
		}
		return false
	})
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	began := time.Now()
	_ = b.Stop(sctx) // the store's close may report the cut connection
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("Stop took %v during a database outage; want the waiting delivery handed back at once", d)
	}
	// Requeued may exceed 1: the in-process transport hands the message
	// straight back until its subscription closes.
	if s := b.Stats(); s.Requeued < 1 || s.Consumed != 0 {
		t.Fatalf("stats %+v; want the waiting delivery handed back, not consumed", s)
	}
	select {
	case <-ran:
		t.Fatal("the consumer ran while the database was down")
	default:
	}
}

// TestRetryingMessageHoldsNoNeighbourBehindIt: a message waiting out an
// in-process retry backoff holds its handler; by default no prefetched
// message waits behind it on RabbitMQ (PrefetchCount defaults to
// ConcurrentMessageLimit), so its neighbours flow through the other
// handler meanwhile.
func TestRetryingMessageHoldsNoNeighbourBehindIt(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("PaymentReceived")
	q := env.q("hol")
	slowFailed := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var doneAt []time.Time
	good := make(chan struct{}, 16)
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 2
			e.Retry = endpoint.Interval(1, 3*time.Second)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				if c.Message.PaymentID == "slow" {
					if c.Attempt == 1 {
						once.Do(func() { close(slowFailed) })
						return errors.New("transient")
					}
					return nil
				}
				mu.Lock()
				doneAt = append(doneAt, time.Now())
				mu.Unlock()
				good <- struct{}{}
				return nil
			}, endpoint.AsMessageType(typ))
		})
	})...)
	ctx := context.Background()
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "slow"}, bus.Headers{bus.HeaderMessageType: typ}); err != nil {
		t.Fatal(err)
	}
	<-slowFailed
	start := time.Now()
	for i := range 6 {
		if err := b.Publish(ctx, PaymentReceived{PaymentID: strconv.Itoa(i)}, bus.Headers{bus.HeaderMessageType: typ}); err != nil {
			t.Fatal(err)
		}
	}
	for range 6 {
		select {
		case <-good:
		case <-time.After(10 * time.Second):
			t.Fatal("good messages not consumed")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, at := range doneAt {
		if d := at.Sub(start); d > 2*time.Second {
			t.Fatalf("a good message was consumed %v after publishing, behind the message in its 3 s retry backoff", d)
		}
	}
}

// TestSendToAMissingQueueParkedAtOnce: through the outbox on RabbitMQ, a
// send to a queue that does not exist is parked at its first attempt with
// the broker's reason (not retried for minutes); the row beside it is
// delivered.
func TestSendToAMissingQueueParkedAtOnce(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("PaymentReceived")
	q := env.q("beside-missing")
	got := make(chan string, 4)
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				got <- c.MessageID
				return nil
			}, endpoint.AsMessageType(typ))
		})
	})...)
	ctx := context.Background()
	missing := "queue:no-such-queue-" + env.suffix
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := b.SendTx(ctx, tx, missing, PaymentReceived{PaymentID: "lost"}, bus.Headers{bus.HeaderMessageID: "missing-" + env.suffix}); err != nil {
			return err
		}
		return b.SendTx(ctx, tx, q, PaymentReceived{PaymentID: "ok"}, bus.Headers{bus.HeaderMessageID: "beside-" + env.suffix, bus.HeaderMessageType: typ})
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != "beside-"+env.suffix {
			t.Fatalf("consumed %q", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the row beside the missing queue's was not delivered")
	}
	waitFor(t, func() bool {
		rows, err := b.OutboxStore().List(ctx, outbox.Query{Status: outbox.StatusParked})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.MessageID == "missing-"+env.suffix {
				if r.Attempts != 1 || !strings.Contains(r.LastError, "returned unroutable") {
					t.Fatalf("parked row: attempts %d, last error %q", r.Attempts, r.LastError)
				}
				return true
			}
		}
		return false
	})
}

// TestStopEndsTheWaitForABusyLock: a delivery whose inbox entry is locked
// by another delivery (a process that died holding it, with InboxLockTimeout
// still to run) waits in process; Stop ends that wait at once and hands the
// message back, instead of holding Stop until the lock expires.
func TestStopEndsTheWaitForABusyLock(t *testing.T) {
	t.Parallel()
	ran := make(chan struct{}, 1)
	b, err := bus.New(quiet(), bus.WithSQLite(filepath.Join(t.TempDir(), "bw.db")), inprocEndpoint("busy-lock", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
			ran <- struct{}{}
			return nil
		})
	}), bus.WithOutbox(func(o *outbox.Options) { o.InboxLockTimeout = time.Minute }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The lock of a delivery that will never finish.
	if _, err := b.InboxStore().TryLock(ctx, inbox.Key{MessageID: "held", ConsumerType: "busy-lock"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "held"}, bus.Headers{bus.HeaderMessageID: "held"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return b.Stats().InFlight == 1 })
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := b.Stop(sctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Stop took %v with a delivery waiting for a busy lock", d)
	}
	select {
	case <-ran:
		t.Fatal("the consumer ran while another delivery held the lock")
	default:
	}
	t.Logf("Stop returned %v after it began, the delivery waiting for a lock with a minute to run", time.Since(start).Round(time.Millisecond))
}

// TestMarkFailingAtCommitRetries: on PostgreSQL with the Pipeline plugin
// the processed mark goes with the COMMIT. When the lock was taken from
// the delivery while its consumer ran (here an operator's release), the
// mark fails, the COMMIT does not run (the consumer's row and the message
// it published are gone with the transaction), and the delivery looks at
// the entry again, finds it free and processes the message: its effect
// and its published message once.
func TestMarkFailingAtCommitRetries(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	table := "effects_marklost_" + env.suffix
	if err := env.db.Table(table).AutoMigrate(&effect{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.db.Exec(`DROP TABLE IF EXISTS "` + table + `"`) })
	var calls atomic.Int32
	refunds := make(chan string, 10)
	b := start(t, append(pgOutbox(env, env.db), quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("marklost", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.NoRetry()
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				if err := bus.TxFromContext(ctx).Table(table).Create(&effect{MessageID: c.MessageID, Consumer: "marklost"}).Error; err != nil {
					return err
				}
				if err := c.Publish(ctx, RefundIssued{PaymentID: c.Message.PaymentID}, bus.Headers{bus.HeaderMessageID: "refund-" + c.MessageID}); err != nil {
					return err
				}
				if calls.Add(1) == 1 {
					// The lock is dropped under the running consumer, as
					// an operator's POST /inbox/release does.
					res := env.db.Exec("UPDATE "+env.prefix+"inbox SET lock_token = NULL, expires_at = now() WHERE message_id = ?", c.MessageID)
					if res.Error != nil || res.RowsAffected != 1 {
						t.Errorf("release under the consumer: %v, %d rows", res.Error, res.RowsAffected)
					}
				}
				return nil
			})
		})
		c.ReceiveEndpoint("marklost-refunds", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[RefundIssued]) error {
				refunds <- c.MessageID
				return nil
			})
		})
	}))...)
	if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p"}, bus.Headers{bus.HeaderMessageID: "marklost-1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-refunds:
		if id != "refund-marklost-1" {
			t.Fatalf("refund %q", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no refund published; consumer ran %d times, stats %+v", calls.Load(), b.Stats())
	}
	drain(t, b)
	if n := calls.Load(); n != 2 {
		t.Errorf("consumer ran %d times, want 2 (the lost commit, then the retry)", n)
	}
	var effects, rows int64
	env.db.Table(table).Where("message_id = ?", "marklost-1").Count(&effects)
	env.db.Raw("SELECT count(*) FROM "+env.prefix+"outbox WHERE message_id = ?", "refund-marklost-1").Scan(&rows)
	if effects != 1 || rows != 1 {
		t.Errorf("%d effects and %d outbox rows of the refund; want 1 and 1", effects, rows)
	}
	if n := processedEntries(t, b, "marklost-1"); n != 1 {
		t.Errorf("%d processed entries; want 1", n)
	}
	if s := b.Stats(); s.DeadLettered != 0 || s.Retries != 0 {
		t.Errorf("stats %+v; a lost lock is no failure: no retry charged, no dead letter", s)
	}
	select {
	case id := <-refunds:
		t.Errorf("refund %s delivered twice", id)
	default:
	}
}
