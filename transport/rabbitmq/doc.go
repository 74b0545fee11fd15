// Package rabbitmq is the RabbitMQ transport: one AMQP connection per bus
// with automatic reconnect, topology declared at start and after every
// reconnect, a pipelined confirm-mode publisher for the outbox relay and a
// subscriber whose every Subscribe call is one competing consumer of an
// endpoint's queue. Hand New to bus.WithTransport, declaring the receive
// endpoints, queue settings and extra topology in its block:
//
//	bus.WithTransport(rabbitmq.New(url, func(c *rabbitmq.Config) {
//		c.ReceiveEndpoint("orders", func(e *endpoint.Endpoint) { ... })
//		c.Topology.DeclareExchange(rabbitmq.Exchange{Name: "audit", Kind: rabbitmq.FanoutExchange})
//	}))
//
// It is written directly on github.com/rabbitmq/amqp091-go: watermill-amqp's
// publisher waits for each confirm in turn, its first dial is not retried and
// its subscriber always requeues, so the few pieces it would contribute are
// simpler to own here.
package rabbitmq
