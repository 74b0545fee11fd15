package bus_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

func TestMain(m *testing.M) {
	if os.Getenv("BW_SCHED_CHILD") != "" {
		schedChild() // TestScheduledSurvivesSIGKILL's child process; never returns
	}
	if os.Getenv("BW_ORDER_CHILD") != "" {
		orderChild() // an instance of TestOrderedAcrossInstancesWithKills; never returns
	}
	if os.Getenv("BW_GC_CHILD") != "" {
		groupCommitChild() // TestGroupCommitSurvivesSIGKILL's child process; never returns
	}
	goleak.VerifyTestMain(m)
}

type PaymentReceived struct {
	PaymentID string  `json:"paymentId"`
	Amount    float64 `json:"amount"`
}

type RefundIssued struct {
	PaymentID string `json:"paymentId"`
}

type seen struct {
	Endpoint, MessageID, CorrelationID, Type string
	Payment                                  PaymentReceived
	Headers                                  map[string]string
}

// recorder collects consumed messages and lets a test wait for a count.
type recorder struct {
	mu   sync.Mutex
	got  []seen
	more chan struct{}
}

func newRecorder() *recorder { return &recorder{more: make(chan struct{}, 1000)} }

func (r *recorder) add(s seen) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
	r.more <- struct{}{}
}

func (r *recorder) wait(t *testing.T, n int) []seen {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		if len(r.got) >= n {
			out := append([]seen(nil), r.got...)
			r.mu.Unlock()
			return out
		}
		r.mu.Unlock()
		select {
		case <-r.more:
		case <-deadline:
			t.Fatalf("timed out waiting for %d messages; got %d", n, len(r.snapshot()))
		}
	}
}

func (r *recorder) snapshot() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.got...)
}

func paymentConsumer(name string, rec *recorder) func(context.Context, *endpoint.Context[PaymentReceived]) error {
	return func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
		rec.add(seen{Endpoint: name, MessageID: c.MessageID, CorrelationID: c.CorrelationID, Type: c.MessageType, Payment: c.Message, Headers: c.Headers})
		return nil
	}
}

func start(t *testing.T, opts ...bus.Option) *bus.Bus {
	t.Helper()
	sig := newBusSignal()
	b, err := bus.New(append(opts[:len(opts):len(opts)], bus.WithObserver(sig.fire))...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	busSignals.Store(b, sig)
	t.Cleanup(func() { busSignals.Delete(b) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return b
}

// quiet keeps test logs readable.
func quiet() bus.Option { return bus.WithLogger(discardLogger()) }

func TestPublishConsumeRoundTrip(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(), inprocEndpoint("payments", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, paymentConsumer("payments", rec))
	}))
	ctx := context.Background()
	err := b.Publish(ctx, PaymentReceived{PaymentID: "p-1", Amount: 42}, bus.Headers{
		bus.HeaderMessageID: "order-42", bus.HeaderCorrelationID: "corr-7", "tenant": "acme",
	})
	if err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 1)[0]
	if got.MessageID != "order-42" {
		t.Errorf("message id = %q, want the preserved order-42", got.MessageID)
	}
	if got.CorrelationID != "corr-7" {
		t.Errorf("correlation id = %q, want corr-7", got.CorrelationID)
	}
	if got.Type != "PaymentReceived" {
		t.Errorf("message type = %q, want PaymentReceived", got.Type)
	}
	if got.Payment != (PaymentReceived{PaymentID: "p-1", Amount: 42}) {
		t.Errorf("payload = %+v", got.Payment)
	}
	if got.Headers["tenant"] != "acme" {
		t.Errorf("custom header lost: %v", got.Headers)
	}
}

func TestNewIDWhenNoneGiven(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(), inprocEndpoint("ids", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, paymentConsumer("ids", rec))
	}))
	for i := 0; i < 2; i++ {
		if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "same"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	got := rec.wait(t, 2)
	if got[0].MessageID == "" || got[0].MessageID == got[1].MessageID {
		t.Fatalf("each publish without a message-id needs its own id; got %q and %q", got[0].MessageID, got[1].MessageID)
	}
}

func TestFanOutToTwoEndpointsAndDeduplication(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("email-notifications", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("email-notifications", rec))
		})
		c.ReceiveEndpoint("audit-log", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("audit-log", rec))
		})
	}))
	ctx := context.Background()
	for i := 0; i < 3; i++ { // one publish and two re-publishes with the same id
		if err := b.Publish(ctx, PaymentReceived{PaymentID: "p-9", Amount: 9}, bus.Headers{bus.HeaderMessageID: "pay-9"}); err != nil {
			t.Fatal(err)
		}
	}
	rec.wait(t, 2)
	// Every delivery settled: one consumed and two duplicates per endpoint;
	// the inbox holds exactly one processed entry per consumer.
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed == 2 && s.Duplicates == 4 })
	if n := processedEntries(t, b, "pay-9"); n != 2 {
		t.Fatalf("processed inbox entries for pay-9: %d, want 2", n)
	}
	drain(t, b)
	got := rec.snapshot()
	count := map[string]int{}
	for _, s := range got {
		count[s.Endpoint]++
	}
	if count["email-notifications"] != 1 || count["audit-log"] != 1 {
		t.Fatalf("each consumer must run exactly once for one message id; ran %v", count)
	}
}

func TestTypedDispatchTwoTypesOneEndpoint(t *testing.T) {
	t.Parallel()
	payments, refunds := newRecorder(), newRecorder()
	b := start(t, quiet(), inprocEndpoint("billing", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, paymentConsumer("billing", payments))
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[RefundIssued]) error {
			refunds.add(seen{Endpoint: "billing", MessageID: c.MessageID, Type: c.MessageType, Payment: PaymentReceived{PaymentID: c.Message.PaymentID}})
			return nil
		})
	}))
	ctx := context.Background()
	if err := b.Publish(ctx, RefundIssued{PaymentID: "r-1"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "p-1"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := refunds.wait(t, 1)[0]; got.Type != "RefundIssued" || got.Payment.PaymentID != "r-1" {
		t.Errorf("refund consumer got %+v", got)
	}
	if got := payments.wait(t, 1)[0]; got.Type != "PaymentReceived" || got.Payment.PaymentID != "p-1" {
		t.Errorf("payment consumer got %+v", got)
	}
	drain(t, b)
	if len(payments.snapshot()) != 1 || len(refunds.snapshot()) != 1 {
		t.Errorf("a message reached the wrong consumer: payments=%d refunds=%d", len(payments.snapshot()), len(refunds.snapshot()))
	}
}

type Order struct {
	ID    string `gorm:"primaryKey"`
	Total int
}

type OrderPlaced struct{ OrderID string }

type OrderAudited struct{ OrderID string }

func TestConsumerPublishesInItsTransactionWithCorrelation(t *testing.T) {
	t.Parallel()
	audits := newRecorder()
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("orders", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
				return c.Publish(ctx, OrderAudited{OrderID: c.Message.OrderID}, nil)
			})
		})
		c.ReceiveEndpoint("audits", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderAudited]) error {
				audits.add(seen{MessageID: c.MessageID, CorrelationID: c.CorrelationID, Payment: PaymentReceived{PaymentID: c.Message.OrderID}})
				return nil
			})
		})
	}))
	if err := b.Publish(context.Background(), OrderPlaced{OrderID: "o-1"}, bus.Headers{bus.HeaderCorrelationID: "conv-1"}); err != nil {
		t.Fatal(err)
	}
	got := audits.wait(t, 1)[0]
	if got.Payment.PaymentID != "o-1" || got.CorrelationID != "conv-1" {
		t.Fatalf("follow-up = %+v; want order o-1 with the correlation id carried on", got)
	}
}

func TestPublishTxCommitAndRollback(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(), inprocEndpoint("tx-payments", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, paymentConsumer("tx-payments", rec))
	}))
	ctx := context.Background()
	if err := b.DB().AutoMigrate(&Order{}); err != nil {
		t.Fatal(err)
	}
	errRollback := errors.New("rollback on purpose")
	err := b.DB().Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{ID: "rolled-back"}).Error; err != nil {
			return err
		}
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "rolled-back"}, nil); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	err = b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := tx.Create(&Order{ID: "committed"}).Error; err != nil {
			return err
		}
		return b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "committed"}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 1)
	drain(t, b)
	if len(rec.snapshot()) != 1 || got[0].Payment.PaymentID != "committed" {
		t.Fatalf("consumed %+v; want only the committed payment", rec.snapshot())
	}
	st, err := b.OutboxStore().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || deliveredRows(t, b.OutboxStore()) != 1 {
		t.Fatalf("outbox stats %+v; want 1 delivered, 0 pending", st)
	}
}

func TestRetryThenEffectOnce(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	done := make(chan struct{})
	b := start(t, quiet(), inprocEndpoint("flaky", func(e *endpoint.Endpoint) {
		e.Retry = endpoint.Interval(3, 10*time.Millisecond)
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[Order]) error {
			tx := bus.TxFromContext(ctx)
			if err := tx.Create(&Order{ID: c.MessageID, Total: c.Message.Total}).Error; err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				return errors.New("first attempt fails after writing (must roll back)")
			}
			close(done)
			return nil
		})
	}))
	if err := b.DB().AutoMigrate(&Order{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(context.Background(), Order{Total: 5}, bus.Headers{bus.HeaderMessageID: "flaky-1"}); err != nil {
		t.Fatal(err)
	}
	<-done
	drain(t, b)
	var n int64
	b.DB().Model(&Order{}).Where("id = ?", "flaky-1").Count(&n)
	if n != 1 || calls.Load() != 2 {
		t.Fatalf("rows=%d calls=%d; want the failed attempt rolled back and one effect after 2 calls", n, calls.Load())
	}
}

func TestPoisonMessagesGoToErrorQueue(t *testing.T) {
	t.Parallel()
	dead := make(chan *endpoint.Delivery, 4)
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("strict", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(2)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				if c.Message.Amount < 0 {
					panic("negative amount")
				}
				return nil
			})
		})
		c.ReceiveEndpoint("strict_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				dead <- d
				return nil
			})
		})
	}))
	ctx := context.Background()
	if err := b.Publish(ctx, PaymentReceived{Amount: -1}, bus.Headers{bus.HeaderMessageID: "neg"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, "strict", bus.Raw{Type: "PaymentReceived", ContentType: "application/json", Body: []byte("{not json")}, bus.Headers{bus.HeaderMessageID: "bad-json"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, "strict", bus.Raw{Type: "Mystery", Body: []byte("{}")}, bus.Headers{bus.HeaderMessageID: "unknown"}); err != nil {
		t.Fatal(err)
	}
	got := map[string]*endpoint.Delivery{}
	for len(got) < 3 {
		select {
		case d := <-dead:
			got[d.MessageID] = d
		case <-time.After(10 * time.Second):
			t.Fatalf("dead letters: got %d of 3", len(got))
		}
	}
	if d := got["neg"]; d.Headers[bus.HeaderFaultAttempts] != "3" || !strings.Contains(d.Headers[bus.HeaderFaultReason], "negative amount") || d.Headers[bus.HeaderFaultStack] == "" {
		t.Errorf("panic dead letter headers: %v", d.Headers)
	}
	if d := got["bad-json"]; d.Headers[bus.HeaderFaultAttempts] != "1" || !strings.Contains(d.Headers[bus.HeaderFaultReason], "JSON") || string(d.Body) != "{not json" {
		t.Errorf("malformed JSON must skip retries and keep its body: %v %q", d.Headers, d.Body)
	}
	if d := got["unknown"]; !strings.Contains(d.Headers[bus.HeaderFaultReason], "no consumer for message type \"Mystery\"") {
		t.Errorf("unknown type reason: %v", d.Headers[bus.HeaderFaultReason])
	}
}

func TestMissingMessageIDPolicies(t *testing.T) {
	t.Parallel()
	dead := make(chan *endpoint.Delivery, 1)
	processed := make(chan string, 1)
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("needs-id", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { return nil })
		})
		c.ReceiveEndpoint("needs-id_error", func(e *endpoint.Endpoint) {
			e.MissingMessageID = endpoint.ProcessMissingID // what is dead-lettered keeps having no id
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { dead <- d; return nil })
		})
		c.ReceiveEndpoint("lenient", func(e *endpoint.Endpoint) {
			e.MissingMessageID = endpoint.ProcessMissingID
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { processed <- string(d.Body); return nil })
		})
	}))
	// Only a raw transport publisher can omit the id; simulate one.
	if err := bus.DeliverRawForTest(b, "needs-id", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := bus.DeliverRawForTest(b, "lenient", []byte("y")); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-dead:
		if !strings.Contains(d.Headers[bus.HeaderFaultReason], "no id") {
			t.Errorf("reason = %q", d.Headers[bus.HeaderFaultReason])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("message without id was not dead-lettered")
	}
	select {
	case body := <-processed:
		if body != "y" {
			t.Errorf("body = %q", body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lenient endpoint did not process the message without id")
	}
}

func TestValidationErrorsAreJoined(t *testing.T) {
	t.Parallel()
	_, err := bus.New(
		inprocEndpoints(func(c *endpoint.Endpoints) {
			c.ReceiveEndpoint("dup", func(e *endpoint.Endpoint) { endpoint.Consumer(e, paymentConsumer("", nil)) })
			c.ReceiveEndpoint("dup", func(e *endpoint.Endpoint) { endpoint.Consumer(e, paymentConsumer("", nil)) })
			c.ReceiveEndpoint("nil-consumer", func(e *endpoint.Endpoint) {
				endpoint.Consumer[PaymentReceived](e, nil)
			})
			c.ReceiveEndpoint("twice", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, paymentConsumer("", nil))
				endpoint.Consumer(e, paymentConsumer("", nil))
			})
			c.ReceiveEndpoint("bad-numbers", func(e *endpoint.Endpoint) {
				e.PrefetchCount = 2
				e.ConcurrentMessageLimit = 4
				e.Retry = endpoint.Interval(3, -time.Second)
				e.Batch = endpoint.Batch{MaxMessages: 65, MaxDuration: -time.Second}
				endpoint.Consumer(e, paymentConsumer("", nil))
			})
			c.ReceiveEndpoint("", func(e *endpoint.Endpoint) {})
		}),
		bus.WithOutbox(func(o *outbox.Options) {
			o.InboxLockTimeout = time.Hour
			o.InboxRetention = time.Minute
			o.PollingInterval = -time.Second
			o.DispatchBatchSize = 20000
		}),
		bus.WithStopTimeout(0),
	)
	if err == nil {
		t.Fatal("New accepted an invalid configuration")
	}
	if !errors.Is(err, endpoint.ErrInvalidConfig) || !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("errors must wrap the sentinels: %v", err)
	}
	for _, want := range []string{
		`endpoint "dup" is declared twice`,
		`nil-consumer": Consumer[bus_test.PaymentReceived]: consumer function is nil`,
		`message type "PaymentReceived" is registered 2 times`,
		`ConcurrentMessageLimit 4 exceeds PrefetchCount 2`,
		`retry interval -1s must be positive`,
		`Batch.MaxMessages 65: use 1 (no group commit) to 64`,
		`Batch.MaxDuration -1s is negative`,
		`endpoint name ""`,
		`InboxRetention 1m0s must be greater than InboxLockTimeout 1h0m0s`,
		`PollingInterval -1s is negative`,
		`DispatchBatchSize 20000 must be within 1–10000`,
		`WithStopTimeout: 0s must be positive`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// TestTransportBuildErrorIsAnInvalidOption: what a transport's Build
// refuses (here rabbitmq.New's URL) comes out of bus.New wrapping
// ErrInvalidOption, with the transport's reason, and never the password.
func TestTransportBuildErrorIsAnInvalidOption(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"", "http://guest:s3cret-pw@127.0.0.1:5672/", "amqp://guest:s3cret-pw@/vhost"} {
		_, err := bus.New(bus.WithTransport(rabbitmq.New(url, nil)))
		if !errors.Is(err, bus.ErrInvalidOption) || !strings.Contains(err.Error(), "rabbitmq: invalid URL") {
			t.Errorf("URL %q: New = %v; want ErrInvalidOption naming the invalid URL", url, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("URL %q: the error shows the password: %v", url, err)
		}
	}
}

func TestGracefulStopDrainsInFlight(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	var finished atomic.Bool
	b, err := bus.New(quiet(), inprocEndpoint("slow", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
			close(entered)
			<-release
			finished.Store(true)
			return nil
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "slow"}, nil); err != nil {
		t.Fatal(err)
	}
	<-entered
	stopped := make(chan error)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		stopped <- b.Stop(sctx)
	}()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a handler was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if !finished.Load() {
		t.Fatal("in-flight handler did not finish before Stop returned")
	}
	if err := b.Start(ctx); !errors.Is(err, bus.ErrStopped) {
		t.Fatalf("Start after Stop = %v, want ErrStopped", err)
	}
}

func TestRunStopsOnContextCancel(t *testing.T) {
	t.Parallel()
	b, err := bus.New(quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- b.Run(ctx) }()
	waitFor(t, func() bool { return b.Health(context.Background()) == nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(context.Background(), PaymentReceived{}, nil); !errors.Is(err, bus.ErrNotStarted) {
		t.Fatalf("Publish after stop = %v", err)
	}
}

func TestPublishErrors(t *testing.T) {
	t.Parallel()
	b := start(t, quiet(), bus.WithMaxMessageSize(1024))
	ctx := context.Background()
	if err := b.Publish(ctx, nil, nil); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("nil message: %v", err)
	}
	if err := b.Publish(ctx, PaymentReceived{PaymentID: strings.Repeat("x", 2000)}, nil); !errors.Is(err, bus.ErrMessageTooLarge) {
		t.Errorf("oversized: %v", err)
	}
	if err := b.Publish(ctx, make(chan int), nil); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("unserializable: %v", err)
	}
	if err := b.Send(ctx, "nobody-here", PaymentReceived{}, nil); err == nil {
		t.Errorf("send to an undeclared queue must fail")
	}
	if err := b.Publish(ctx, PaymentReceived{}, bus.Headers{bus.HeaderMessageID: strings.Repeat("i", 201)}); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("long id: %v", err)
	}
}

func TestDelayedRedeliveryThenSuccess(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	done := make(chan string, 1)
	b := start(t, quiet(), inprocEndpoint("redelivered", func(e *endpoint.Endpoint) {
		e.Retry = endpoint.NoRetry()
		e.Redelivery = []time.Duration{20 * time.Millisecond, 40 * time.Millisecond}
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
			calls.Add(1)
			if n := c.Headers["BW-Redelivery-Count"]; n != "2" {
				return fmt.Errorf("not yet (redelivery %q)", n)
			}
			done <- c.MessageID
			return nil
		})
	}))
	if err := b.Publish(context.Background(), PaymentReceived{}, bus.Headers{bus.HeaderMessageID: "later"}); err != nil {
		t.Fatal(err)
	}
	if id := <-done; id != "later" {
		t.Fatalf("id %q", id)
	}
	drain(t, b)
	if s := b.Stats(); s.Redelivered != 2 || s.Consumed != 1 || s.DeadLettered != 0 || calls.Load() != 3 {
		t.Fatalf("stats %+v calls %d; want 2 delayed redeliveries then success on the 3rd call", s, calls.Load())
	}
}

func TestDelayedRedeliveryExhaustedDeadLetters(t *testing.T) {
	t.Parallel()
	dead := make(chan *endpoint.Delivery, 1)
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("hopeless", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			e.Redelivery = []time.Duration{10 * time.Millisecond}
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				return errors.New("still broken")
			})
		})
		c.ReceiveEndpoint("hopeless_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { dead <- d; return nil })
		})
	}))
	if err := b.Publish(context.Background(), PaymentReceived{}, bus.Headers{bus.HeaderMessageID: "hopeless-1"}); err != nil {
		t.Fatal(err)
	}
	d := <-dead
	if d.Headers["BW-Redelivery-Count"] != "1" || d.Headers[bus.HeaderFaultAttempts] != "2" {
		t.Fatalf("dead letter headers %v; want one redelivery, then 2 attempts", d.Headers)
	}
	if s := b.Stats(); s.Redelivered != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestHandlerTimeoutAppliesPerAttempt(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	done := make(chan struct{})
	b := start(t, quiet(), inprocEndpoint("timeouts", func(e *endpoint.Endpoint) {
		e.HandlerTimeout = 500 * time.Millisecond // generous: the inbox's own statements run under it too
		e.Retry = endpoint.Immediate(1)
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
			if calls.Add(1) == 1 {
				<-ctx.Done() // the first attempt overruns its timeout
				return ctx.Err()
			}
			close(done)
			return nil
		})
	}))
	if err := b.Publish(context.Background(), PaymentReceived{}, nil); err != nil {
		t.Fatal(err)
	}
	<-done
	drain(t, b)
	if s := b.Stats(); s.Consumed != 1 || s.DeadLettered != 0 || s.Retries != 1 {
		t.Fatalf("stats %+v; want the timed-out attempt retried with a fresh timeout", s)
	}
}

func TestRetriesCountedOnlyWhenRetried(t *testing.T) {
	t.Parallel()
	dead := make(chan struct{}, 1)
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("always-fails", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(3)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error { return errors.New("no") })
		})
		c.ReceiveEndpoint("always-fails_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { dead <- struct{}{}; return nil })
		})
	}))
	if err := b.Publish(context.Background(), PaymentReceived{}, nil); err != nil {
		t.Fatal(err)
	}
	<-dead
	// The error queue's consumer can run before the failing delivery has
	// counted its dead letter: wait for the counter, then check retries.
	waitStats(t, b, func(s bus.Stats) bool { return s.DeadLettered == 1 })
	if s := b.Stats(); s.Retries != 3 || s.DeadLettered != 1 {
		t.Fatalf("stats %+v; want 3 retries (4 attempts) and 1 dead letter", s)
	}
}

func TestHandlerTimeoutStillDeadLetters(t *testing.T) {
	t.Parallel()
	dead := make(chan struct{}, 1)
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("timeout-fails", func(e *endpoint.Endpoint) {
			e.HandlerTimeout = time.Second
			e.Retry = endpoint.Immediate(2)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error { return errors.New("no") })
		})
		c.ReceiveEndpoint("timeout-fails_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { dead <- struct{}{}; return nil })
		})
	}))
	if err := b.Publish(context.Background(), PaymentReceived{}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dead:
	case <-time.After(10 * time.Second):
		t.Fatalf("an endpoint with HandlerTimeout must still dead-letter; stats %+v", b.Stats())
	}
}

// TestHandlerTimeoutOverrunIsTheHandlersFailure (issue 32, defect 2): a
// handler that ignores its context, overruns HandlerTimeout and returns
// nil made the inbox's processed mark fail with the deadline, which was
// read as a database outage (context.DeadlineExceeded is a net.Error):
// consumption paused, the attempt was not counted and the consumer ran
// again and again. The overrun is the handler's failure: counted, retried
// per the policy, dead-lettered, no outage.
func TestHandlerTimeoutOverrunIsTheHandlersFailure(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	dead := make(chan *endpoint.Delivery, 1)
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("overruns", func(e *endpoint.Endpoint) {
			e.HandlerTimeout = 200 * time.Millisecond
			e.Retry = endpoint.Immediate(2)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				calls.Add(1)
				time.Sleep(400 * time.Millisecond) // ignores its context
				return nil
			})
		})
		c.ReceiveEndpoint("overruns_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { dead <- d; return nil })
		})
	}))
	if err := b.Publish(context.Background(), PaymentReceived{}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-dead:
		if reason := d.Headers[bus.HeaderFaultReason]; !strings.Contains(reason, "HandlerTimeout") {
			t.Errorf("dead-letter reason %q does not name the handler's timeout", reason)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("not dead-lettered within 20s: the consumer ran %d times; stats %+v", calls.Load(), b.Stats())
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("the consumer ran %d times; want 3 (1 + 2 retries)", n)
	}
	if n := bus.OutagesForTest(b); n != 0 {
		t.Errorf("%d database outages for a handler's overrun; want 0", n)
	}
}
