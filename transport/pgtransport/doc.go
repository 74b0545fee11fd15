// Package pgtransport is the PostgreSQL transport: a bus with no broker.
// Every endpoint queue is a set of rows in one table; consumers claim rows
// one at a time with FOR UPDATE SKIP LOCKED and lease them, so several
// consumers of one queue, in one process or many, each get a different
// message; publishing fans a message out to every queue bound to its
// exchange, using a bindings table that every process writes at Start.
// Hand New to bus.WithTransport, declaring the receive endpoints in its
// block:
//
//	bus.WithTransport(pgtransport.New(db, func(c *pgtransport.Config) {
//		c.ReceiveEndpoint("orders", func(e *endpoint.Endpoint) { ... })
//	}))
//
// Like the in-process transport, it refuses Endpoint.Queue settings and
// bindings with a routing key, arguments or an exchange destination.
//
// Publishing goes through watermill-sql v4's Publisher with this package's
// SchemaAdapter, on the pool (Deliver) or on the caller's transaction
// (DeliverTx). Consuming uses the same adapter's claim query, driven by
// this package's own loop rather than watermill-sql's Subscriber; see
// docs/transports.md for why.
//
// The tables are defined by the migration files under migrations/
// (Migrations; MigrationSQL for another table prefix), which Start runs
// unless Config.DisableAutoMigrate is set, and checks for otherwise.
package pgtransport
