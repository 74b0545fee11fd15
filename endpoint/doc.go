// Package endpoint is the fluent configuration of receive endpoints: a queue,
// the typed consumers that handle its messages, and how it consumes them
// (prefetch, concurrency, retries, dead-lettering, inbox mode, serializer,
// broker-side queue settings and bindings).
//
// Declare endpoints inside the configuration block of the transport given
// to bus.WithTransport (rabbitmq.New, pgtransport.New, inproc.New), whose
// Config embeds Endpoints:
//
//	c.ReceiveEndpoint("email-notifications", func(e *endpoint.Endpoint) {
//		endpoint.Consumer(e, sendEmail) // func(ctx, *endpoint.Context[PaymentReceived]) error
//		e.PrefetchCount = 16
//		e.ConcurrentMessageLimit = 8
//		e.Retry = endpoint.Exponential(5, 100*time.Millisecond, 10*time.Second)
//	})
//
// Consumers are registered with package-level generic functions (Consumer,
// ConsumerOf, RawConsumer) because Go methods cannot take type parameters.
// Mistakes are collected, not panicked: bus.New returns them all, joined,
// each wrapping ErrInvalidConfig and bus.ErrInvalidOption. Queue settings
// and routing-key bindings are RabbitMQ's; the other transports refuse
// them.
package endpoint
