// Package pgtransport is the PostgreSQL transport: a bus with no broker.
// Every endpoint queue is a set of rows in one table; consumers claim rows
// one at a time with FOR UPDATE SKIP LOCKED and lease them, so several
// consumers of one queue, in one process or many, each get a different
// message; publishing fans a message out to every queue bound to its
// exchange, using a bindings table that every process writes at Start.
// Hand New's value to bus.WithTransport; its Config declares the receive
// endpoints (it embeds endpoint.Endpoints) and sets the transport's own
// options. Unless bus.WithDatabase names another database, the bus keeps
// its inbox and outbox in the transport's, so that a message published in a
// transaction there is written straight to its queues (DeliverTx).
//
// It owns its tables (<prefix>queue_messages, <prefix>queues,
// <prefix>bindings; Config.TablePrefix), their migration (run at Start, or
// MigrationSQL for your own tool with Config.DisableAutoMigrate) and its
// errors: ErrNoQueue (a send to a queue no process declared) and
// ErrNotSameDatabase (DeliverTx on a transaction of another database; it
// wraps transport.ErrTxUnsupported). Every exchange is a fan-out: it
// refuses endpoints that set queue settings (endpoint.Queue) or bindings
// with a routing key, arguments or an exchange destination.
//
// Publishing goes through watermill-sql v4's Publisher with this package's
// SchemaAdapter, on the pool (Deliver) or on the caller's transaction
// (DeliverTx). Consuming uses the same adapter's claim query, driven by
// this package's own loop rather than watermill-sql's Subscriber; see
// docs/transports.md for why.
package pgtransport
