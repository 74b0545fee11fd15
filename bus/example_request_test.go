package bus_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/inproc"
)

type QuoteRequest struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

type Quote struct {
	SKU   string `json:"sku"`
	Cents int    `json:"cents"`
}

// ExampleRequest asks an endpoint for a quote and waits for its answer.
func ExampleRequest() {
	ctx := context.Background()
	// snippet:start request-endpoint
	declare := func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("price-quotes", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[QuoteRequest]) error {
				if c.Message.Quantity <= 0 {
					return endpoint.Permanent(errors.New("quantity must be positive"))
				}
				// To the outbox, in this consumer's transaction.
				return c.Respond(ctx, Quote{SKU: c.Message.SKU, Cents: 250 * c.Message.Quantity})
			}, endpoint.Named("quoter"))
		})
	}
	// snippet:end request-endpoint
	b, err := bus.New(bus.WithTransport(inproc.New(func(c *inproc.Config) { declare(&c.Endpoints) })),
		bus.WithLogger(discardLogger()))
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)

	// snippet:start request-call
	q, err := bus.Request[Quote](ctx, b, "price-quotes", QuoteRequest{SKU: "apple", Quantity: 4},
		bus.WithRequestTimeout(5*time.Second))
	// snippet:end request-call
	fmt.Println(q.SKU, q.Cents, err)

	// snippet:start request-fault
	_, err = bus.Request[Quote](ctx, b, "price-quotes", QuoteRequest{SKU: "apple"})
	var fault *bus.RequestFaultError
	if errors.As(err, &fault) {
		fmt.Println("fault from", fault.Endpoint+":", fault.Message)
	}
	// snippet:end request-fault

	// Output:
	// apple 1000 <nil>
	// fault from price-quotes: consumer quoter: permanent: quantity must be positive
}
