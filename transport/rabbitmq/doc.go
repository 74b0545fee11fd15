// Package rabbit is the RabbitMQ transport: one AMQP connection per bus with
// automatic reconnect, topology declared at start and after every reconnect,
// a pipelined confirm-mode publisher for the outbox relay and a subscriber
// whose every Subscribe call is one competing consumer of an endpoint's queue.
//
// It is written directly on github.com/rabbitmq/amqp091-go: watermill-amqp's
// publisher waits for each confirm in turn, its first dial is not retried and
// its subscriber always requeues, so the few pieces it would contribute are
// simpler to own here.
package rabbitmq
