// Package bus is BareWire for Go: a message bus with a transactional outbox
// and inbox. This package is the entry point and the guide.
//
// # Building a bus
//
// New takes options and does no I/O; Start connects, creates tables and
// starts consuming; Stop drains in-flight messages; Run is Start, wait for
// the context, Stop.
//
//	b, err := bus.New(
//		bus.WithRabbitMQ(url, func(rmq *endpoint.RabbitMQ) {
//			rmq.ReceiveEndpoint("email-notifications", func(e *endpoint.Endpoint) {
//				endpoint.Consumer(e, emailNotification) // func(ctx, *endpoint.Context[PaymentReceived]) error
//				e.PrefetchCount = 16
//				e.ConcurrentMessageLimit = 8
//			})
//		}),
//		bus.WithOutbox(db, func(o *outbox.Options) { o.InboxLockTimeout = 30 * time.Second }),
//	)
//
// With no transport option the bus uses the embedded in-process transport;
// with no WithOutbox it keeps its tables in an embedded SQLite database (in
// memory unless WithSQLite names a file). Endpoint declarations are the same
// on every transport: declare them in a func(*endpoint.Endpoints) and pass
// it to WithEndpoints or call it from WithRabbitMQ's configure function.
// New reports every configuration mistake at once, joined; each wraps
// ErrInvalidOption or endpoint.ErrInvalidConfig.
//
// # Publishing
//
// Publish fans a message out to every endpoint that consumes its type; Send
// delivers to one queue. Their Tx twins, PublishTx and SendTx, write to the
// outbox in the caller's GORM transaction: the message is sent if and only
// if that transaction commits, at least once, and with its message id
// preserved so that receivers' inboxes absorb any repeat. Transaction runs a
// transaction and wakes the relay the moment it commits.
//
// Headers: "message-id" (HeaderMessageID) keeps a caller-chosen id end to
// end, for example to make a retried HTTP request publish the same message;
// "correlation-id" sets the correlation id; "BW-MessageType" overrides the
// message type name (by default the Go type name, or the value of a
// MessageType() string method).
//
// # Consuming
//
// A consumer runs inside one database transaction, reachable with
// TxFromContext(ctx). The inbox marks the message processed in the same
// transaction, and whatever the consumer publishes (c.Publish, c.Send, or
// b.Publish with the consumer's ctx) is written to the outbox in it too. So
// the consumer's writes, its outgoing messages and the processed mark
// commit together or not at all, and a redelivered or re-published message
// (same id) is skipped: exactly one effect per consumer type (the endpoint
// name).
//
// A failing consumer is retried in process by the endpoint's Retry policy,
// then dead-lettered to "<endpoint>_error" (or the queue's dead-letter
// exchange) with fault headers; errors wrapped with endpoint.Permanent,
// undecodable bodies and unknown message types skip the retries. A panic is
// an error with its stack in the fault headers; it never stops the process.
//
// # Guarantees and their limits
//
// See docs/guarantees.md. In short: effects are exactly once per consumer
// type within InboxRetention; delivery is at least once; the embedded
// in-process transport keeps messages in memory and loses what is queued if
// the process dies (the outbox side is still transactional).
package bus
