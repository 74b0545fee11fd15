// Package gormstore implements the inbox and outbox stores (inbox.Store,
// outbox.Store and outbox.Notifier) on GORM, for PostgreSQL and SQLite.
//
// # Usage
//
//	db, err := postgresdb.Open(dsn) // gormstore/postgresdb; or gormstore.OpenSQLite("app.db")
//	store, err := gormstore.New(db)
//	err = store.Migrate(ctx)
//	inboxStore, outboxStore := store.Inbox(), store.Outbox()
//
// Migrate creates the tables barewire_inbox and barewire_outbox (the prefix
// is set with WithTablePrefix).
//
// # Migrations
//
// The schema is defined by numbered SQL files, embedded and returned by
// Migrations(dialect): goose migrations that are plain SQL scripts as well
// (goose runs what follows "-- +goose Up"; other tools read that line as a
// comment), written with the default prefix barewire_ and idempotent. Migrate
// runs exactly their statements, and so does a team's own tool: copy the
// files into its migrations folder, or, for another prefix, take the script
// from MigrationSQL(dialect, prefix). A service whose tool owns the schema
// calls CheckSchema at start instead of Migrate (bus.Start does so when
// outbox.Options.DisableAutoMigrate is set): it names every table and index
// missing and the file that creates it. On PostgreSQL, Migrate and
// CheckSchema also check that the server is PostgreSQL 13 or newer.
//
// # Operations
//
// Beyond the interfaces, Inbox.ForceRelease drops a stuck inbox lock
// whatever its token (the admin package's POST /inbox/release). Every
// statement on the inbox and outbox tables is in this package, with
// parameters for all values: the only identifiers built into the SQL are
// the table names, from the validated prefix.
//
// # Transactions
//
// The outbox writes in the caller's transaction, which it finds in the
// context: put it there with WithTx. Inbox.Process does the same for the
// handler it runs, so everything a handler writes through
// TxFromContext(ctx) — business rows and published messages — commits
// together with the inbox mark, or not at all.
//
// # Clocks
//
// Every lock, lease, expiry and retention is computed by the database's
// clock (PostgreSQL now(), SQLite strftime('now')), never the application's,
// so that instances whose clocks drift still agree. SQLite times are stored as
// UTC text with millisecond precision. The one exception is for tests:
// WithClock (SQLite only) makes the statements read "now" from a Go clock
// that a test can move forward.
//
// # Dialects
//
// On PostgreSQL the relay claims rows with FOR UPDATE SKIP LOCKED and holds
// them by those locks until it settles the batch (Outbox.ClaimBatch), so
// many instances can relay concurrently without waiting for each other. Add
// returns the transaction's id to a commit watcher, which sends a NOTIFY
// after the commit (outside the caller's transaction, coalesced) that
// Outbox.Listen turns into wake-ups for relays in other processes; this
// needs PostgreSQL 13 or later (pg_current_xact_id, pg_xact_status). Close
// the Store to stop the watcher. SQLite runs one writer at a time; leases keep
// claims exclusive, and Listen only waits for its context to end (relays fall
// back to polling).
//
// With SQLite, open the database with OpenSQLite, which allows a single
// connection: SQLite admits one writer, and a single connection turns
// SQLITE_BUSY errors into orderly waiting in the connection pool. The
// consequence is that while Inbox.Process (or any transaction) runs, it holds
// the only connection: a handler must do all its database work through the
// transaction in its context (TxFromContext), never through the *gorm.DB it
// was built with, or it waits for itself forever.
package gormstore
