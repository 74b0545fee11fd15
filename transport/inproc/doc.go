// Package inproc is the embedded in-process transport: one FIFO queue per
// endpoint with competing consumers, an exchange per message type bound to
// the queues of the endpoints that consume it, and redelivery on nack. It
// keeps messages in memory only: it is for development, tests and
// single-process tools, where the outbox still guarantees that nothing is
// published unless its transaction commits.
package inproc
