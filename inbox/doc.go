// Package inbox gives every receive endpoint an exactly-once effect: a
// message's effect is applied once per consumer type even when the broker
// redelivers it, a process crashes mid-handler, or a producer re-publishes
// it with the same message-id.
//
// The key is (message id, consumer type). The middleware takes a lock row in
// its own short transaction (insert, or a conditional re-lock of an expired
// unprocessed row), runs the consumer in a second transaction that also marks
// the row processed — guarded by the lock token, so a delivery whose lock
// expired and was taken over cannot commit — and releases the lock at once
// when the consumer fails. Stores implement the small Store interface and
// prove it with the inboxtest conformance suite; gormstore implements it for
// PostgreSQL and SQLite.
package inbox
