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
//		bus.WithTransport(rabbitmq.New(url, func(c *rabbitmq.Config) {
//			c.ReceiveEndpoint("email-notifications", func(e *endpoint.Endpoint) {
//				endpoint.Consumer(e, emailNotification) // func(ctx, *endpoint.Context[PaymentReceived]) error
//				e.ConcurrentMessageLimit = 8
//			})
//		})),
//		bus.WithDatabase(db),
//		bus.WithOutbox(func(o *outbox.Options) { o.InboxLockTimeout = 30 * time.Second }),
//	)
//
// The one way to declare receive endpoints is inside the transport's block
// given to WithTransport: rabbitmq.New (package transport/rabbitmq),
// pgtransport.New (transport/pgtransport) or inproc.New (transport/inproc).
// Every transport's Config embeds endpoint.Endpoints, so a
// func(*endpoint.Endpoints) that declares a service's endpoints serves all
// of them: call it as declare(&c.Endpoints) inside the block. A service
// imports only the transport package it uses, and links only its driver.
//
// With no WithTransport the bus uses the embedded in-process transport with
// no endpoints; with no WithDatabase it keeps its tables in the
// transport's database (the PostgreSQL transport) or in an embedded SQLite
// database (in memory unless WithSQLite names a file). WithOutbox changes
// the outbox and inbox options on whichever database that is.
//
// New reports every configuration mistake at once, joined: the options',
// the endpoints' and the transport's. Each wraps ErrInvalidOption, the one
// sentinel to test for (errors.Is(err, bus.ErrInvalidOption)); an
// endpoint's also wraps endpoint.ErrInvalidConfig.
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
// # Scheduling
//
// Delay(d) and DeliverAt(t) return Headers that hold a message in the outbox
// until it is due (by the database's clock), on every transport and across
// restarts; more headers merge in as extra arguments. CancelScheduled (and
// CancelScheduledTx) cancels one by message id while it has not left; with a
// consumer's ctx both the schedule and the cancel happen in the consumer's
// transaction. See docs/scheduling.md.
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
// name). Under load, deliveries waiting on an endpoint share one
// transaction (group commit, endpoint.Batch): each consumer runs inside its
// own savepoint, so a failing one is rolled back alone; see docs/inbox.md.
//
// A failing consumer is retried in process by the endpoint's Retry policy,
// then dead-lettered to "<endpoint>_error" (or, on RabbitMQ, the queue's
// dead-letter exchange) with fault headers; errors wrapped with
// endpoint.Permanent, undecodable bodies and unknown message types skip the
// retries. A panic is an error with its stack in the fault headers; it
// never stops the process.
//
// # Guarantees and their limits
//
// See docs/guarantees.md. In short: effects are exactly once per consumer
// type within InboxRetention; delivery is at least once; the embedded
// in-process transport keeps messages in memory and loses what is queued if
// the process dies (the outbox side is still transactional).
package bus
