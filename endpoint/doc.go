// Package endpoint is the fluent configuration of receive endpoints: a queue,
// the typed consumers that handle its messages, and how it consumes them
// (prefetch, concurrency, retries, dead-lettering, inbox mode, serializer,
// broker-side queue settings and bindings).
//
// Declare endpoints inside bus.WithRabbitMQ, bus.WithEndpoints or
// bus.ReceiveEndpoint:
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
// each wrapping ErrInvalidConfig.
package endpoint
