// Package endpoint is the transport-neutral configuration of receive
// endpoints: a queue, the typed consumers that handle its messages, and how
// it consumes them (prefetch, concurrency, retries, dead-lettering, inbox
// mode, serializer, queue settings and bindings).
//
// Endpoints are declared inside the configuration block of the transport
// given to bus.WithTransport, whose Config embeds Endpoints; that is the one
// way to declare them:
//
//	bus.WithTransport(rabbitmq.New(url, func(c *rabbitmq.Config) {
//		c.ReceiveEndpoint("email-notifications", func(e *endpoint.Endpoint) {
//			endpoint.Consumer(e, sendEmail) // func(ctx, *endpoint.Context[PaymentReceived]) error
//			e.ConcurrentMessageLimit = 8
//			e.Retry = endpoint.Exponential(5, 100*time.Millisecond, 10*time.Second)
//		})
//	}))
//
// A func(*Endpoints) declares the same endpoints on any transport
// (declare(&c.Endpoints) inside the block). Queue settings (Endpoint.Queue:
// type, TTL, dead-letter exchange, limits, arguments) and bindings with a
// routing key, arguments or an exchange destination mean something on
// RabbitMQ only; the in-process and PostgreSQL transports refuse them.
// RabbitMQ's own topology types (Exchange, Topology) are in package
// transport/rabbitmq.
//
// Consumers are registered with package-level generic functions (Consumer,
// ConsumerOf, RawConsumer) because Go methods cannot take type parameters.
// Mistakes are collected, not panicked: bus.New returns them all, joined,
// each wrapping ErrInvalidConfig (and bus.ErrInvalidOption).
package endpoint
