package bustest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/transport/inproc"
)

// exampleT stands in for the *testing.T a real test passes.
type exampleT struct{ cleanups []func() }

func (t *exampleT) Helper()                           {}
func (t *exampleT) Name() string                      { return "Example" }
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Logf(string, ...any)               {}
func (t *exampleT) Errorf(format string, args ...any) { fmt.Printf("FAIL: "+format+"\n", args...) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// test runs fn as a test would, then its cleanups (the bus stops).
func test(fn func(t bustest.T)) {
	t := &exampleT{}
	defer func() {
		for i := len(t.cleanups) - 1; i >= 0; i-- {
			t.cleanups[i]()
		}
	}()
	fn(t)
}

// A consumer writes an invoice and publishes InvoiceIssued through the
// outbox; the harness sees the row committed with the delivery, relayed,
// and consumed by the next endpoint.
func Example_outbox() {
	test(func(t bustest.T) {
		// snippet:start outbox
		h := bustest.New(t, orders(endpoint.NoRetry())) // the service's own endpoint declarations
		if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		ctx := context.Background()
		if err := h.Bus.Publish(ctx, OrderPlaced{ID: "42"}, nil); err != nil {
			t.Fatalf("publish: %v", err)
		}
		order := bustest.Consumed[OrderPlaced](h, bustest.OnEndpoint("billing"))
		invoice := bustest.Published[InvoiceIssued](h, bustest.Relayed())
		bustest.Consumed[InvoiceIssued](h, bustest.OnEndpoint("mail"))
		h.WaitIdle()

		fmt.Println("billing:", order.Outcome, order.Message.ID)
		fmt.Println("published by", invoice.ParentEndpoint, "through the outbox:", invoice.Outbox, "relayed:", invoice.Relayed)
		var n int64
		h.Bus.DB().Model(&Invoice{}).Count(&n)
		fmt.Println("invoices:", n, "outbox rows:", len(h.OutboxRows(ctx)))
		// snippet:end outbox
	})
	// Output:
	// billing: consumed 42
	// published by billing through the outbox: true relayed: true
	// invoices: 1 outbox rows: 1
}

// The same message delivered twice: the inbox skips the second delivery
// and the consumer runs once.
func Example_duplicate() {
	test(func(t bustest.T) {
		// snippet:start duplicate
		h := bustest.New(t, orders(endpoint.NoRetry()))
		if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		ctx := context.Background()
		if err := h.Bus.Publish(ctx, OrderPlaced{ID: "7"}, nil); err != nil {
			t.Fatalf("publish: %v", err)
		}
		first := bustest.Consumed[OrderPlaced](h)
		h.Redeliver(ctx, first.Record, "") // same id, type, body and headers, to the same endpoint
		dup := bustest.Consumed[OrderPlaced](h, bustest.WithOutcome(bus.OutcomeDuplicate))
		h.WaitIdle()

		fmt.Println("second delivery:", dup.Outcome, "same id:", dup.MessageID == first.MessageID)
		fmt.Println("consumer runs:", len(h.Seen("billing")))
		// snippet:end duplicate
	})
	// Output:
	// second delivery: duplicate same id: true
	// consumer runs: 1
}

// The first attempt fails, the retry policy runs it again, and the second
// attempt commits.
func Example_retry() {
	test(func(t bustest.T) {
		// snippet:start retry
		h := bustest.New(t, orders(endpoint.Immediate(2)))
		if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		bustest.FailNext[OrderPlaced](h, 1, errors.New("payment service unavailable"))
		if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "9"}, nil); err != nil {
			t.Fatalf("publish: %v", err)
		}
		failed := bustest.Faulted[OrderPlaced](h)
		ok := bustest.Consumed[OrderPlaced](h)

		fmt.Println("attempt", failed.Attempt, "failed:", errors.Unwrap(failed.Err))
		fmt.Println("attempt", ok.Attempt, ok.Outcome)
		// snippet:end retry
	})
	// Output:
	// attempt 1 failed: payment service unavailable
	// attempt 2 consumed
}

// Every attempt fails: the message is dead-lettered with fault headers.
func Example_deadLetter() {
	test(func(t bustest.T) {
		// snippet:start dead-letter
		h := bustest.New(t, orders(endpoint.Immediate(1)))
		bustest.FailNext[OrderPlaced](h, 2, errors.New("card declined"))
		if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "3"}, nil); err != nil {
			t.Fatalf("publish: %v", err)
		}
		dl := bustest.DeadLettered[OrderPlaced](h, bustest.OnEndpoint("billing"))

		fmt.Println(dl.Outcome, "after", dl.Headers[bus.HeaderFaultAttempts], "attempts:", errors.Unwrap(dl.Err))
		fmt.Println("fault endpoint:", dl.Headers[bus.HeaderFaultEndpoint])
		// snippet:end dead-letter
	})
	// Output:
	// dead_lettered after 2 attempts: card declined
	// fault endpoint: billing
}

// One consumer alone: run it on a message in a transaction, no endpoints,
// and look at what it wrote and published.
func ExampleConsume() {
	test(func(t bustest.T) {
		// snippet:start consume
		h := bustest.New(t) // no endpoints: a database and an outbox
		if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		bill := func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
			if err := bus.TxFromContext(ctx).Create(&Invoice{OrderID: c.Message.ID}).Error; err != nil {
				return err
			}
			return c.Publish(ctx, InvoiceIssued{OrderID: c.Message.ID}, nil)
		}
		res := bustest.Consume(h, bill, OrderPlaced{ID: "5"}, nil)
		fmt.Println("error:", res.Err)
		for _, p := range res.Published {
			fmt.Println("published", p.MessageType, "to", p.Destination, "committed:", p.Committed)
		}
		var n int64
		h.Bus.DB().Model(&Invoice{}).Count(&n)
		fmt.Println("invoices:", n)
		// snippet:end consume
	})
	// Output:
	// error: <nil>
	// published InvoiceIssued to exchange:InvoiceIssued committed: true
	// invoices: 1
}

// A delivery crashed holding its inbox lock; the redelivery waits for the
// lock, the fake clock expires it, and the message is processed once — in
// milliseconds, not InboxLockTimeout.
func Example_lockExpiry() {
	test(func(t bustest.T) {
		// snippet:start lock-expiry
		h := bustest.New(t, orders(endpoint.NoRetry())) // InboxLockTimeout: the default 30 s
		if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		ctx := context.Background()
		start := time.Now()
		// Another instance took the lock for order-11 and died.
		h.CrashedDelivery(ctx, "order-11", "billing", inbox.DefaultLockTimeout)
		if err := h.Bus.Publish(ctx, OrderPlaced{ID: "11"}, bus.Headers{bus.HeaderMessageID: "order-11"}); err != nil {
			t.Fatalf("publish: %v", err)
		}
		h.Advance(inbox.DefaultLockTimeout) // the crashed delivery's lock expires
		got := bustest.Consumed[OrderPlaced](h, bustest.OnEndpoint("billing"))
		h.WaitIdle()

		var entry inbox.Entry
		for _, e := range h.InboxEntries(ctx) {
			if e.MessageID == "order-11" && e.ConsumerType == "billing" {
				entry = e
			}
		}
		var n int64
		h.Bus.DB().Model(&Invoice{}).Count(&n)
		fmt.Println("redelivery:", got.Outcome, "lock taken:", entry.Attempts, "times")
		fmt.Println("consumer runs:", len(h.Seen("billing")), "invoices:", n)
		fmt.Println("well under the lock timeout:", time.Since(start) < inbox.DefaultLockTimeout/10)
		// snippet:end lock-expiry
	})
	// Output:
	// redelivery: consumed lock taken: 2 times
	// consumer runs: 1 invoices: 1
	// well under the lock timeout: true
}

// The connection drops while a consumer is still handling a message: the
// transport delivers it again at once, the inbox makes the redelivery wait
// for the first delivery and skips it as a duplicate.
func Example_dropConnection() {
	test(func(t bustest.T) {
		// snippet:start drop-connection
		running, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		h := bustest.New(t, bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
					once.Do(func() { close(running) })
					<-release // still handling when the connection drops
					return bus.TxFromContext(ctx).Create(&Invoice{OrderID: c.Message.ID}).Error
				})
			})
		})))
		if err := h.Bus.DB().AutoMigrate(&Invoice{}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "12"}, nil); err != nil {
			t.Fatalf("publish: %v", err)
		}
		<-running
		h.DropConnection() // the unacknowledged delivery goes back to the queue
		close(release)
		first := bustest.Consumed[OrderPlaced](h)
		again := bustest.Consumed[OrderPlaced](h, bustest.WithOutcome(bus.OutcomeDuplicate))
		h.WaitIdle()

		var n int64
		h.Bus.DB().Model(&Invoice{}).Count(&n)
		fmt.Println("first delivery:", first.Outcome, "redelivered:", again.Headers[bus.HeaderRedelivered], again.Outcome)
		fmt.Println("consumer runs:", len(h.Seen("billing")), "invoices:", n)
		// snippet:end drop-connection
	})
	// Output:
	// first delivery: consumed redelivered: true duplicate
	// consumer runs: 1 invoices: 1
}
