package wmnats_test

import (
	"context"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmnats"
)

type PaymentReceived struct {
	PaymentID string `json:"payment_id"`
}

// A bus on NATS JetStream: the endpoints are declared in the preset's block,
// as on every transport. It needs a NATS server with JetStream and a
// database for the inbox and outbox (bus.WithDatabase), so it has no Output.
func Example() {
	// snippet:start wmnats
	b, err := bus.New(bus.WithTransport(wmnats.New("nats://127.0.0.1:4222", func(c *wmnats.Config) {
		c.AckWait = time.Minute // above the slowest consumer
		c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				return nil // the effects, in bus.TxFromContext(ctx)
			})
		})
	})))
	// snippet:end wmnats
	_, _ = b, err
}
