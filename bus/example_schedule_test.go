package bus_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
)

// InvoiceSettled is what the in-consumer example handles.
type InvoiceSettled struct {
	InvoiceID string `json:"invoiceId"`
}

// PaymentDue is a reminder the examples schedule.
type PaymentDue struct {
	InvoiceID string `json:"invoiceId"`
}

func ExampleDelay() {
	ctx := context.Background()
	got := make(chan string, 2)
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("reminders", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentDue]) error {
				got <- c.Message.InvoiceID
				return nil
			})
		})
	})))
	defer b.Stop(ctx)

	// snippet:start schedule
	// Due in 2s: the message waits in the outbox until then.
	err := b.Publish(ctx, PaymentDue{InvoiceID: "inv-1"}, bus.Delay(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// At a time, with a message id of our own to cancel it by.
	id := bus.NewMessageID()
	err = b.Publish(ctx, PaymentDue{InvoiceID: "inv-2"},
		bus.DeliverAt(time.Now().Add(time.Hour), bus.Headers{bus.HeaderMessageID: id}))
	if err != nil {
		log.Fatal(err)
	}
	// snippet:end schedule

	// snippet:start list
	waiting, err := b.OutboxStore().List(ctx, outbox.Query{Scheduled: true})
	// snippet:end list
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("scheduled:", len(waiting))

	// snippet:start cancel
	cancelled, err := b.CancelScheduled(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	// false: it has left already (or is leaving now), was cancelled before,
	// or never existed.
	fmt.Println("cancelled:", cancelled)
	// snippet:end cancel

	fmt.Println("consumed", <-got)
	again, _ := b.CancelScheduled(ctx, id)
	fmt.Println("cancelled again:", again)
	// Output:
	// scheduled: 2
	// cancelled: true
	// consumed inv-1
	// cancelled again: false
}

// A consumer schedules and cancels in its own transaction: both take
// effect only if its work commits (a saga's timeout works this way).
func ExampleBus_CancelScheduled_inConsumer() {
	ctx := context.Background()
	var b *bus.Bus
	done := make(chan bool, 1)
	b = startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
			// snippet:start in-consumer
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceSettled]) error {
				// ctx carries the consumer's transaction: the cancel commits
				// or rolls back with the consumer's work.
				cancelled, err := b.CancelScheduled(ctx, "reminder-"+c.Message.InvoiceID)
				if err != nil {
					return err
				}
				done <- cancelled
				return nil
			})
			// snippet:end in-consumer
		})
	})))
	defer b.Stop(ctx)

	// snippet:start schedule-tx
	err := b.Transaction(ctx, func(tx *gorm.DB) error {
		// ... write the invoice with tx ...
		return b.SendTx(ctx, tx, "reminders", PaymentDue{InvoiceID: "inv-3"},
			bus.Delay(7*24*time.Hour, bus.Headers{bus.HeaderMessageID: "reminder-inv-3"}))
	})
	// snippet:end schedule-tx
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Publish(ctx, InvoiceSettled{InvoiceID: "inv-3"}, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println("reminder cancelled:", <-done)
	// Output: reminder cancelled: true
}
