package bus_test

import (
	"context"
	"testing"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// PublishThroughOutbox: a Publish outside a transaction leaves an outbox row
// (delivered), instead of going straight to the transport.
func TestPublishThroughOutboxWritesAnOutboxRow(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(),
		bus.WithOutboxOptions(func(o *outbox.Options) { o.PublishThroughOutbox = true }),
		bus.ReceiveEndpoint("through-outbox", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("through-outbox", rec))
		}))
	if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 1)
	drain(t, b)
	st, err := b.OutboxStore().Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Delivered != 1 {
		t.Fatalf("outbox %+v; want the publish recorded as one delivered row", st)
	}
}

// DeleteOnDeliver: confirmed rows are deleted rather than kept for retention.
func TestDeleteOnDeliverLeavesNoRows(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(),
		bus.WithOutboxOptions(func(o *outbox.Options) { o.PublishThroughOutbox = true; o.DeleteOnDeliver = true }),
		bus.ReceiveEndpoint("delete-on-deliver", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("delete-on-deliver", rec))
		}))
	if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 1)
	drain(t, b)
	st, err := b.OutboxStore().Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Delivered != 0 || st.Pending != 0 || st.Parked != 0 {
		t.Fatalf("outbox %+v; want no rows left after delivery", st)
	}
}
