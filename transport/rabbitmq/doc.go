// Package rabbitmq is the RabbitMQ transport: one AMQP connection per bus
// with automatic reconnect, topology declared at start and after every
// reconnect, a pipelined confirm-mode publisher for the outbox relay and a
// subscriber whose Subscribe calls are handlers of an endpoint's queue, all
// served by one broker consumer per queue and connection. Hand New's value to bus.WithTransport; its Config
// declares the receive endpoints (it embeds endpoint.Endpoints) and sets the
// connection (TLS, timeouts, back-pressure, Mandatory).
//
// It owns what only RabbitMQ has: the endpoints' queue settings
// (endpoint.Queue: classic, quorum or stream queues, TTL, length limits,
// overflow, dead-letter exchange, arguments), bindings with routing keys,
// arguments or an exchange destination, and extra topology (Topology,
// Exchange and its kinds). See docs/topology.md.
//
// Its errors say what failed in their text; the ones to match with
// errors.Is are the seam's and the outbox's: transport.ErrUnroutable (a
// mandatory publish no queue received), outbox.ErrUndeliverable (a message
// the broker cannot take, a send to a missing queue) and
// outbox.ErrTransportUnavailable (not connected, no confirm in time).
// Configuration errors come back from bus.New wrapping bus.ErrInvalidOption.
//
// It is written directly on github.com/rabbitmq/amqp091-go: watermill-amqp's
// publisher waits for each confirm in turn, its first dial is not retried and
// its subscriber always requeues, so the few pieces it would contribute are
// simpler to own here.
package rabbitmq
