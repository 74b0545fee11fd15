// Package bustest is a test harness for services built on the bus.
//
// New starts a bus with the service's own options (its endpoint
// declarations; a real transport and database when the test passes them,
// the embedded default otherwise), records what the bus does, and stops
// it when the test ends, failing the test if the bus's goroutines outlive
// it. Tests then publish or send as the service would and wait, with no
// sleeps, for what they expect:
//
//	h := bustest.New(t, bus.WithTransport(inproc.New(func(c *inproc.Config) {
//		service.Declare(&c.Endpoints) // the service's own ReceiveEndpoint calls
//	})))
//	_ = h.Bus.Publish(ctx, OrderPlaced{ID: "42"}, nil)
//	bustest.Consumed[OrderPlaced](h, bustest.OnEndpoint("billing"))
//	bustest.Published[InvoiceIssued](h)   // the consumer's outbox row, committed
//	h.WaitIdle()                           // nothing in flight, outbox drained, queues empty
//
// Every wait is bounded by Harness.Timeout and the test's deadline, and a
// wait that times out fails the test with a report of what the bus did:
// deliveries by endpoint, type and outcome, and publications by state.
//
// The harness sees the bus through bus.WithObserver: deliveries handled
// (committed, duplicate skipped, redelivery, dead-lettered, requeued),
// attempts retried, messages published directly or written to the outbox,
// and outbox rows the relay delivered. An outbox row a consumer writes is
// counted as published when its delivery commits; a row of a rolled-back
// attempt never is.
//
// The bus's clock is the real one: waits for time-based behaviour (inbox
// lock expiry, redelivery delays, the relay lease) take as long as that
// time. Configure short durations for such tests.
package bustest
