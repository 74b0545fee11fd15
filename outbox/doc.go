// Package outbox makes publishing transactional: a message published inside
// a database transaction is written to the outbox table in that transaction
// and delivered by a Relay after commit — never if the transaction rolls
// back, at least once if it commits, with its message id preserved so that
// receivers' inboxes absorb repeats.
//
// The Relay claims batches that its store holds until they are settled
// (BatchClaimer: on PostgreSQL, row locks taken FOR UPDATE SKIP LOCKED in
// an open transaction) or that it leases (ClaimLeased: SQLite's), so any
// number of relays can share one database without sending a live claim
// twice; it pipelines the transport's confirms
// and marks only confirmed rows. It wakes on local commits, on other
// processes' commits (Notifier, PostgreSQL LISTEN/NOTIFY) and on a polling
// interval. A row that keeps failing is parked after MaxAttempts and never
// blocks the rows behind it. Stores implement Store and prove it with the
// outboxtest conformance suite.
package outbox
