package bustest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
)

type OrderPlaced struct {
	ID string `json:"id"`
}

type InvoiceIssued struct {
	OrderID string `json:"orderId"`
}

type Invoice struct {
	OrderID string `gorm:"primaryKey"`
}

// snippet:start declarations

// declareOrders is a service's declarations: billing writes an invoice and
// publishes InvoiceIssued through the outbox; mail consumes it. It takes
// *endpoint.Endpoints, which every transport's configuration embeds, so the
// service declares the same endpoints on RabbitMQ in production.
func declareOrders(c *endpoint.Endpoints, retry endpoint.RetryPolicy) {
	c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
		e.Retry = retry
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
			if err := bus.TxFromContext(ctx).Create(&Invoice{OrderID: c.Message.ID}).Error; err != nil {
				return err
			}
			return c.Publish(ctx, InvoiceIssued{OrderID: c.Message.ID}, nil)
		})
	})
	c.ReceiveEndpoint("mail", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error { return nil })
	})
}

// orders declares them on the embedded in-process transport, for tests.
func orders(retry endpoint.RetryPolicy) bus.Option {
	return bus.WithTransport(inproc.New(func(c *inproc.Config) { declareOrders(&c.Endpoints, retry) }))
}

// snippet:end declarations

func start(t *testing.T, retry endpoint.RetryPolicy) *bustest.Harness {
	t.Helper()
	h := bustest.New(t, orders(retry))
	if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestOutboxFollowUpIsSeenAndRelayed(t *testing.T) {
	t.Parallel()
	h := start(t, endpoint.NoRetry())
	ctx := context.Background()
	if err := h.Bus.Publish(ctx, OrderPlaced{ID: "42"}, nil); err != nil {
		t.Fatal(err)
	}
	got := bustest.Consumed[OrderPlaced](h, bustest.OnEndpoint("billing"))
	if got.Message.ID != "42" {
		t.Fatalf("consumed %+v", got.Message)
	}
	pub := bustest.Published[InvoiceIssued](h, bustest.Relayed())
	if !pub.Outbox || pub.ParentEndpoint != "billing" || pub.ParentID != got.MessageID || pub.Message.OrderID != "42" {
		t.Fatalf("publication %+v", pub.Record)
	}
	bustest.Consumed[InvoiceIssued](h, bustest.OnEndpoint("mail"), bustest.Where(func(m InvoiceIssued) bool { return m.OrderID == "42" }))
	h.WaitIdle()
	if n := len(h.InboxEntries(ctx)); n != 2 {
		t.Fatalf("%d inbox entries, want 2 (billing, mail)", n)
	}
	rows := h.OutboxRows(ctx)
	if len(rows) != 1 || rows[0].MessageType != "InvoiceIssued" {
		t.Fatalf("outbox rows %+v", rows)
	}
	if seen := h.Seen("billing"); len(seen) != 1 || seen[0].MessageID != got.MessageID {
		t.Fatalf("billing saw %+v", seen)
	}
}

func TestRedeliverIsSkippedAsDuplicate(t *testing.T) {
	t.Parallel()
	h := start(t, endpoint.NoRetry())
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "7"}, nil); err != nil {
		t.Fatal(err)
	}
	first := bustest.Consumed[OrderPlaced](h)
	h.Redeliver(context.Background(), first.Record, "")
	dup := bustest.Consumed[OrderPlaced](h, bustest.WithOutcome(bus.OutcomeDuplicate))
	if dup.MessageID != first.MessageID {
		t.Fatalf("duplicate of %s, want %s", dup.MessageID, first.MessageID)
	}
	h.WaitIdle()
	if n := len(bustest.PublishedN[InvoiceIssued](h, 1)); n != 1 {
		t.Fatalf("%d invoices published", n)
	}
	if seen := h.Seen("billing"); len(seen) != 1 {
		t.Fatalf("billing's consumer ran %d times, want once", len(seen))
	}
}

func TestFailNextRetriesThenSucceeds(t *testing.T) {
	t.Parallel()
	h := start(t, endpoint.Immediate(2))
	boom := errors.New("payment service down")
	bustest.FailNext[OrderPlaced](h, 1, boom)
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "9"}, nil); err != nil {
		t.Fatal(err)
	}
	f := bustest.Faulted[OrderPlaced](h)
	if !errors.Is(f.Err, boom) || f.Kind != bustest.KindRetried {
		t.Fatalf("fault %+v", f.Record)
	}
	ok := bustest.Consumed[OrderPlaced](h)
	if ok.Attempt != 2 {
		t.Fatalf("committed on attempt %d, want 2", ok.Attempt)
	}
}

func TestRolledBackAttemptPublishesNothing(t *testing.T) {
	t.Parallel()
	var once sync.Once
	h := bustest.New(t, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
				if err := c.Publish(ctx, InvoiceIssued{OrderID: c.Message.ID}, nil); err != nil {
					return err
				}
				var err error
				once.Do(func() { err = errors.New("fails after publishing") })
				return err
			})
		})
	})))
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "1"}, nil); err != nil {
		t.Fatal(err)
	}
	bustest.Consumed[OrderPlaced](h)
	h.WaitIdle()
	var rolledBack, sent int
	for _, r := range h.Records() {
		if r.Kind == bustest.KindPublished && r.MessageType == "InvoiceIssued" {
			if r.RolledBack {
				rolledBack++
			}
			if r.Committed {
				sent++
			}
		}
	}
	if rolledBack != 1 || sent != 1 {
		t.Fatalf("%d rolled back, %d sent; want 1 and 1\n%s", rolledBack, sent, h.Report())
	}
}

func TestDeadLetteredWithFaultHeaders(t *testing.T) {
	t.Parallel()
	h := start(t, endpoint.Immediate(1))
	bustest.FailNext[OrderPlaced](h, 2, errors.New("card declined"))
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "3"}, nil); err != nil {
		t.Fatal(err)
	}
	dl := bustest.DeadLettered[OrderPlaced](h)
	if !strings.HasSuffix(dl.Headers[bus.HeaderFaultReason], ": card declined") || dl.Headers[bus.HeaderFaultAttempts] != "2" || dl.Headers[bus.HeaderFaultEndpoint] != "billing" {
		t.Fatalf("fault headers %v", dl.Headers)
	}
	h.WaitIdle() // the error queue has no consumer: not counted
}

// fakeT records failures instead of failing, and runs cleanups on demand.
type fakeT struct {
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (f *fakeT) Helper()      {}
func (f *fakeT) Name() string { return "fake" }
func (f *fakeT) Cleanup(fn func()) {
	f.cleanups = append(f.cleanups, fn)
}
func (f *fakeT) Logf(string, ...any) {}
func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	panic(fakeFatal{})
}
func (f *fakeT) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

type fakeFatal struct{}

func fatalOf(fn func()) (fataled bool) {
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(fakeFatal); !ok {
				panic(v)
			}
			fataled = true
		}
	}()
	fn()
	return false
}

func TestTimedOutWaitReportsWhatHappened(t *testing.T) {
	t.Parallel()
	ft := &fakeT{}
	h := bustest.New(ft, orders(endpoint.NoRetry()))
	defer ft.runCleanups()
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "no table"}, nil); err != nil {
		t.Fatal(err)
	}
	// The invoices table does not exist: billing dead-letters the order.
	bustest.DeadLettered[OrderPlaced](h)
	h.Timeout = 100 * time.Millisecond
	if !fatalOf(func() { bustest.Consumed[OrderPlaced](h) }) {
		t.Fatal("the wait did not fail")
	}
	rep := ft.errs[0]
	t.Log(rep)
	for _, want := range []string{"waiting for 1 consumed OrderPlaced", "billing  OrderPlaced  dead_lettered", "no such table"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
}

func TestLeakedGoroutineFailsTheTest(t *testing.T) {
	t.Parallel()
	stuck := make(chan struct{})
	defer close(stuck)
	ft := &fakeT{}
	h := bustest.New(ft, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("leaky", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
				go func() { <-stuck }() // outlives the bus
				return nil
			})
		})
	})))
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "1"}, nil); err != nil {
		t.Fatal(err)
	}
	bustest.Consumed[OrderPlaced](h)
	ft.runCleanups()
	if len(ft.errs) != 1 || !strings.Contains(ft.errs[0], "goroutines of the bus still running") || !strings.Contains(ft.errs[0], "TestLeakedGoroutineFailsTheTest") {
		t.Fatalf("errors %q", ft.errs)
	}
}

func TestConsumeOneConsumerAlone(t *testing.T) {
	t.Parallel()
	h := bustest.New(t)
	if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
		t.Fatal(err)
	}
	bill := func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
		if err := bus.TxFromContext(ctx).Create(&Invoice{OrderID: c.Message.ID}).Error; err != nil {
			return err
		}
		return c.Publish(ctx, InvoiceIssued{OrderID: c.Message.ID}, nil)
	}
	res := bustest.Consume(h, bill, OrderPlaced{ID: "5"}, nil)
	if res.Err != nil || len(res.Published) != 1 || !res.Published[0].Committed || res.Published[0].MessageType != "InvoiceIssued" {
		t.Fatalf("result %+v", res)
	}
	var n int64
	h.Bus.DB().Model(&Invoice{}).Count(&n)
	if n != 1 {
		t.Fatalf("%d invoices", n)
	}
	// The same id again: the primary key refuses it, and nothing is published.
	res = bustest.Consume(h, bill, OrderPlaced{ID: "5"}, nil)
	if res.Err == nil || len(res.Published) != 0 {
		t.Fatalf("second result %+v", res)
	}
}

func TestWaitIdleWaitsForQueuedMessages(t *testing.T) {
	t.Parallel()
	h := start(t, endpoint.NoRetry())
	for i := range 20 {
		if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: fmt.Sprint(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	h.WaitIdle()
	var orders, invoices int
	for _, r := range h.Records() {
		if r.Kind == bustest.KindHandled && r.Outcome == bus.OutcomeCommitted {
			switch r.MessageType {
			case "OrderPlaced":
				orders++
			case "InvoiceIssued":
				invoices++
			}
		}
	}
	if orders != 20 || invoices != 20 {
		t.Fatalf("idle after %d orders and %d invoices consumed, want 20 and 20\n%s", orders, invoices, h.Report())
	}
}

// TestRedeliveryDelayFollowsTheFakeClock: a delayed redelivery is an
// outbox row due at the clock's now + delay, so advancing the fake clock
// past the delay sends it at once: an hour's redelivery in milliseconds.
func TestRedeliveryDelayFollowsTheFakeClock(t *testing.T) {
	t.Parallel()
	h := bustest.New(t, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("slow-retry", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.NoRetry()
			e.Redelivery = []time.Duration{time.Hour}
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error { return nil })
		})
	})))
	bustest.FailNext[OrderPlaced](h, 1, errors.New("not yet"))
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "r-1"}, nil); err != nil {
		t.Fatal(err)
	}
	bustest.Faulted[OrderPlaced](h, bustest.WithOutcome(bus.OutcomeRedelivery))
	began := time.Now()
	h.Advance(time.Hour)
	ok := bustest.Consumed[OrderPlaced](h)
	if ok.Headers[bus.HeaderRedeliveryCount] != "1" {
		t.Fatalf("consumed without the redelivery count: %v", ok.Headers)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("the redelivery took %v of real time after the clock passed its delay", d)
	}
}

// TestScheduledPublishFollowsTheFakeClock: a message published with
// bus.Delay is not consumed while the fake clock stands before its time,
// and is consumed at once when h.Advance moves the clock past it.
func TestScheduledPublishFollowsTheFakeClock(t *testing.T) {
	t.Parallel()
	h := bustest.New(t, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("reminders", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error { return nil })
		})
	})))
	ctx := context.Background()
	if err := h.Bus.Publish(ctx, OrderPlaced{ID: "s-1"}, bus.Delay(24*time.Hour, bus.Headers{bus.HeaderMessageID: "s-1"})); err != nil {
		t.Fatal(err)
	}
	h.Advance(23 * time.Hour)
	// A message published now passes through the relay after the advance:
	// the claim that takes it would take s-1 too, were s-1 due.
	if err := h.Bus.Transaction(ctx, func(tx *gorm.DB) error {
		return h.Bus.PublishTx(ctx, tx, OrderPlaced{ID: "probe"}, bus.Headers{bus.HeaderMessageID: "probe"})
	}); err != nil {
		t.Fatal(err)
	}
	bustest.Consumed[OrderPlaced](h, bustest.WithID("probe"))
	for _, r := range h.Records() {
		if r.Kind == bustest.KindHandled && r.MessageID == "s-1" {
			t.Fatalf("handled before its time: %v", &r)
		}
	}
	if rows, err := h.Bus.OutboxStore().List(ctx, outbox.Query{Scheduled: true}); err != nil || len(rows) != 1 {
		t.Fatalf("List(Scheduled) = %d rows, %v; want s-1 still waiting", len(rows), err)
	}
	began := time.Now()
	h.Advance(time.Hour)
	got := bustest.Consumed[OrderPlaced](h, bustest.WithID("s-1"))
	if _, ok := got.Headers[bus.HeaderDelay]; ok {
		t.Errorf("the consumer saw the schedule header: %v", got.Headers)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("the scheduled message took %v of real time after the clock passed its time", d)
	}
}

// TestConsumeCancelsScheduled: a consumer under Consume cancels a
// scheduled message through its Delivery, in its transaction: a consumer
// that fails leaves the message scheduled, one that commits deletes it.
func TestConsumeCancelsScheduled(t *testing.T) {
	t.Parallel()
	h := bustest.New(t)
	ctx := context.Background()
	if err := h.Bus.Send(ctx, "nowhere", OrderPlaced{ID: "later"}, bus.Delay(time.Hour, bus.Headers{bus.HeaderMessageID: "timeout-1"})); err != nil {
		t.Fatal(err)
	}
	cancel := func(fail bool) endpoint.HandleFunc[OrderPlaced] {
		return func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
			ok, err := c.CancelScheduled(ctx, "timeout-1")
			if err != nil || !ok {
				return fmt.Errorf("CancelScheduled = %v, %v", ok, err)
			}
			if fail {
				return errors.New("fails after cancelling")
			}
			return nil
		}
	}
	if res := bustest.Consume(h, cancel(true), OrderPlaced{ID: "1"}, nil); res.Err == nil || !strings.Contains(res.Err.Error(), "fails after cancelling") {
		t.Fatalf("failing consumer: %v", res.Err)
	}
	if res := bustest.Consume(h, cancel(false), OrderPlaced{ID: "2"}, nil); res.Err != nil {
		t.Fatalf("committing consumer: %v (the failed one's cancel must have rolled back)", res.Err)
	}
	if ok, err := h.Bus.CancelScheduled(ctx, "timeout-1"); err != nil || ok {
		t.Fatalf("CancelScheduled after the committed cancel = %v, %v; want false, nil", ok, err)
	}
}
