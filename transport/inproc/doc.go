// Package inproc is the embedded in-process transport: one FIFO queue per
// endpoint with competing consumers, an exchange per message type bound to
// the queues of the endpoints that consume it, and redelivery on nack. It
// keeps messages in memory only: it is for development, tests and
// single-process tools, where the outbox still guarantees that nothing is
// published unless its transaction commits. A bus with no bus.WithTransport
// runs on one with no endpoints; to consume on it, declare the endpoints in
// New's block:
//
//	bus.WithTransport(inproc.New(func(c *inproc.Config) {
//		c.ReceiveEndpoint("orders", func(e *endpoint.Endpoint) { ... })
//	}))
//
// It refuses what only a broker has: Endpoint.Queue settings, and bindings
// with a routing key, arguments or an exchange destination.
package inproc
