package wmpubsub_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

// Any Watermill Pub/Sub without a preset: say how to open the publisher
// and each queue's subscriber (one consumer group per queue), what a nack
// does, and how to tell the Pub/Sub is down. (gochannel stands in for your
// Pub/Sub here; it has no consumer groups, so it is not a real choice.)
func Example() {
	// snippet:start custom
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	b, err := bus.New(bus.WithTransport(wmpubsub.New(func(c *wmpubsub.Config) {
		c.Publisher = func(context.Context) (message.Publisher, error) { return pubSub, nil }
		c.Subscriber = func(_ context.Context, queue string) (message.Subscriber, error) {
			return pubSub, nil // a subscriber whose consumer group is queue
		}
		c.Topics = wmpubsub.Topics{
			Type:  func(t string) string { return "type." + t },
			Queue: func(q string) string { return "queue." + q },
		}
		c.Semantics = wmpubsub.Semantics{NackRedelivers: true}
		c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil })
		})
	})))
	// snippet:end custom
	_, _ = b, err
}
