-- BareWire inbox and outbox tables for SQLite: migration 001.
--
-- This file is a goose migration and a plain SQL script at once: goose runs
-- the statements after "-- +goose Up"; Atlas, psql and any tool that runs a
-- file as it is read that line as a comment. Copy it into your migrations
-- folder (renumbered to fit your sequence) and set
-- outbox.Options.DisableAutoMigrate. There is no Down section on purpose:
-- rolling back would drop the outbox with the messages not yet relayed.
--
-- The table prefix is "barewire_". gormstore.MigrationSQL("sqlite", prefix)
-- returns the same statements with another prefix; Store.Migrate runs
-- exactly those, and a test checks that both make the same schema.
--
-- Every statement is idempotent, so the file can be run any number of
-- times. Keep every statement a CREATE TABLE / CREATE INDEX ... IF NOT
-- EXISTS (Migrate checks the catalog for those names and, when all exist,
-- runs no DDL, since DDL locks live tables; CheckSchema names the missing
-- ones), ending with ';' at the end of its line and holding no other ';'.
--
-- Times are UTC text 'YYYY-MM-DD HH:MM:SS.SSS' written by
-- strftime('%Y-%m-%d %H:%M:%f', 'now'): the fixed width makes text
-- comparison equal time comparison, and the DATETIME declared type lets the
-- driver return time.Time values.

-- +goose Up

-- Inbox: one row per (message, consumer). A row is locked while
-- processed_at IS NULL and expires_at is in the future; lock_token fences the
-- holder so that a delivery whose lock expired and was taken over cannot
-- commit.
CREATE TABLE IF NOT EXISTS barewire_inbox (
    message_id    TEXT     NOT NULL,
    consumer_type TEXT     NOT NULL,
    received_at   DATETIME NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    processed_at  DATETIME,
    expires_at    DATETIME NOT NULL,
    lock_token    TEXT,
    attempts      INTEGER  NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, consumer_type)
);

-- Cleanup of processed rows.
CREATE INDEX IF NOT EXISTS barewire_inbox_processed_idx
    ON barewire_inbox (processed_at) WHERE processed_at IS NOT NULL;
-- Cleanup and stats of unprocessed rows (a small set).
CREATE INDEX IF NOT EXISTS barewire_inbox_expires_idx
    ON barewire_inbox (expires_at) WHERE processed_at IS NULL;
-- Inspection (List pages newest first).
CREATE INDEX IF NOT EXISTS barewire_inbox_received_idx
    ON barewire_inbox (received_at);

-- Outbox: one row per message to publish. AUTOINCREMENT so that ids are
-- never reused after the newest rows are deleted (relays and List paging
-- rely on ids only growing).
CREATE TABLE IF NOT EXISTS barewire_outbox (
    id             INTEGER  PRIMARY KEY AUTOINCREMENT,
    message_id     TEXT     NOT NULL,
    destination    TEXT     NOT NULL,
    routing_key    TEXT     NOT NULL DEFAULT '',
    message_type   TEXT     NOT NULL DEFAULT '',
    content_type   TEXT     NOT NULL DEFAULT '',
    correlation_id TEXT     NOT NULL DEFAULT '',
    headers        TEXT     NOT NULL DEFAULT '{}',
    payload        BLOB     NOT NULL,
    created_at     DATETIME NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    status         TEXT     NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'delivered', 'parked')),
    attempts       INTEGER  NOT NULL DEFAULT 0,
    last_error     TEXT     NOT NULL DEFAULT '',
    delivered_at   DATETIME,
    locked_by      TEXT,
    locked_until   DATETIME,
    available_at   DATETIME NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);

-- The claim query walks pending rows in the order they become due
-- (available_at, then id) and stops at the first one not yet due: the
-- partial index keeps it cheap however many delivered rows are retained and
-- however many scheduled rows wait in the future (docs/benchmarks.md has the
-- plan with 1,000,000 of them). The relay's next-due lookup reads it too.
CREATE INDEX IF NOT EXISTS barewire_outbox_due_idx
    ON barewire_outbox (available_at, id) WHERE status = 'pending';
-- Cancelling a scheduled message by its message id.
CREATE INDEX IF NOT EXISTS barewire_outbox_message_idx
    ON barewire_outbox (message_id) WHERE status = 'pending';
-- Cleanup of delivered rows.
CREATE INDEX IF NOT EXISTS barewire_outbox_delivered_idx
    ON barewire_outbox (delivered_at) WHERE status = 'delivered';
-- Requeue and stats of parked rows.
CREATE INDEX IF NOT EXISTS barewire_outbox_parked_idx
    ON barewire_outbox (id) WHERE status = 'parked';
