package bus_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/inproc"
)

type OrderLine struct {
	OrderID string
	Step    string
}

// An ordered endpoint: the messages of one order run one at a time, in
// publish order; different orders run in parallel on 8 partitions. The
// key comes from the message (WithOrderingKey) or from the publish
// (bus.OrderingKey).
func ExampleOrderingKey() {
	ctx := context.Background()
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	// snippet:start ordering
	b, err := bus.New(
		bus.WithOrderingKey(func(m OrderLine) string { return m.OrderID }),
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("order-lines", func(e *endpoint.Endpoint) {
				e.Ordered(8) // partitions: keys spread over 8 lanes
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderLine]) error {
					mu.Lock()
					defer mu.Unlock()
					if seen = append(seen, c.Message.OrderID+":"+c.Message.Step); len(seen) == 3 {
						close(done)
					}
					return nil
				})
			})
		})),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)
	for _, step := range []string{"created", "paid", "shipped"} {
		// The key is "o-1" from WithOrderingKey; bus.OrderingKey("o-1")
		// as the headers would set it explicitly.
		if err := b.Publish(ctx, OrderLine{OrderID: "o-1", Step: step}, nil); err != nil {
			log.Fatal(err)
		}
	}
	// snippet:end ordering
	<-done
	fmt.Println(seen)
	// Output: [o-1:created o-1:paid o-1:shipped]
}
