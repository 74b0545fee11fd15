// Package inproc is the embedded in-process transport: one FIFO queue per
// endpoint with competing consumers, an exchange per message type bound to
// the queues of the endpoints that consume it, and redelivery on nack. It
// keeps messages in memory only: it is for development, tests and
// single-process tools, where the outbox still guarantees that nothing is
// published unless its transaction commits.
//
// A bus with no bus.WithTransport runs on one with no endpoints; to consume,
// hand inproc.New to bus.WithTransport and declare the endpoints in its
// block (Config embeds endpoint.Endpoints and has no settings of its own).
// It refuses what only a broker honours: endpoints that set queue settings
// (endpoint.Queue) and bindings with a routing key, arguments or an
// exchange destination. A send to a queue nobody declared fails with
// ErrNoQueue.
package inproc
