package rabbitmq_test

// The examples in this file are the source of code blocks in docs/. They
// build a bus on RabbitMQ, which connects to nothing until Start, so they
// run with `go test` and check that the configuration is accepted. Edit
// them here, then run `go run ./internal/tools/docsnippets -fix`.

import (
	"context"
	"fmt"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

type ShipmentDispatched struct {
	ShipmentID string `json:"shipmentId"`
}

// ExampleTopology declares queue settings, bindings and extra topology.
func ExampleTopology() {
	handle := func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error { return nil }
	amqpURL := "amqp://guest:guest@127.0.0.1:5672/"
	// snippet:start topology
	b, err := bus.New(bus.WithTransport(rabbitmq.New(amqpURL, func(c *rabbitmq.Config) {
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, handle) // binds exchange "ShipmentDispatched" → queue "shipping"
			e.Queue.Type = endpoint.Quorum
			e.Queue.MaxLength = 100_000
			e.Queue.Overflow = "reject-publish"
			// Also receive what a legacy system publishes to a topic exchange.
			e.Bindings = append(e.Bindings, endpoint.Binding{Exchange: "legacy.events", RoutingKey: "shipment.*"})
		})
		// Objects no endpoint owns: declared at start and after every reconnect.
		c.Topology.DeclareExchange(rabbitmq.Exchange{Name: "legacy.events", Kind: rabbitmq.TopicExchange})
		c.Topology.DeclareExchange(rabbitmq.Exchange{Name: "audit", Kind: rabbitmq.FanoutExchange})
		c.Topology.DeclareQueue(endpoint.Queue{Name: "audit-archive", Type: endpoint.Quorum, MessageTTL: 30 * 24 * time.Hour})
		c.Topology.Bind(endpoint.Binding{Exchange: "audit", Queue: "audit-archive"})
		c.Topology.Bind(endpoint.Binding{Exchange: "ShipmentDispatched", ToExchange: "audit"})
	})))
	// snippet:end topology
	fmt.Println(b != nil, err)
	// Output: true <nil>
}

// ExampleTopology_deadLetterExchange hands dead letters to an exchange of
// your own instead of the "<name>_error" queue.
func ExampleTopology_deadLetterExchange() {
	handle := func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error { return nil }
	amqpURL := "amqp://guest:guest@127.0.0.1:5672/"
	// snippet:start dead-letter-exchange
	b, err := bus.New(bus.WithTransport(rabbitmq.New(amqpURL, func(c *rabbitmq.Config) {
		c.Topology.DeclareExchange(rabbitmq.Exchange{Name: "dead-letters", Kind: rabbitmq.DirectExchange})
		c.Topology.DeclareQueue(endpoint.Queue{Name: "shipping-dead", Type: endpoint.Quorum})
		c.Topology.Bind(endpoint.Binding{Exchange: "dead-letters", Queue: "shipping-dead", RoutingKey: "shipping"})
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, handle)
			e.Queue.DeadLetterExchange = "dead-letters" // shipping_error takes what it routes nowhere
			e.Queue.DeadLetterRoutingKey = "shipping"
		})
	})))
	// snippet:end dead-letter-exchange
	fmt.Println(b != nil, err)
	// Output: true <nil>
}

// ExampleConfig_cluster connects to a 3-node cluster and runs every
// endpoint on quorum queues.
func ExampleConfig_cluster() {
	handle := func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error { return nil }
	// snippet:start cluster
	b, err := bus.New(bus.WithTransport(rabbitmq.New("amqp://app:secret@rabbit-1:5672/app", func(c *rabbitmq.Config) {
		// The other nodes: tried in order at start, the next one at once
		// when the node in use is lost. Equivalent: one comma-separated url.
		c.URLs = []string{"amqp://app:secret@rabbit-2:5672/app", "amqp://app:secret@rabbit-3:5672/app"}
		c.QueueType = endpoint.Quorum // every endpoint queue and its error queue
		c.DeliveryLimit = 20          // redeliveries before the broker dead-letters (the default)
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, handle)
		})
	})))
	// snippet:end cluster
	fmt.Println(b != nil, err)
	// Output: true <nil>
}
