-- BareWire PostgreSQL transport tables: migration 001.
--
-- This file is a goose migration and a plain SQL script at once: goose runs
-- the statements after "-- +goose Up"; Atlas, psql and any tool that runs a
-- file as it is read that line as a comment. Copy it into your migrations
-- folder (renumbered to fit your sequence) and set the transport's
-- DisableAutoMigrate. There is no Down section on purpose: rolling back
-- would drop the queues with the messages in them.
--
-- The table prefix is "barewire_". pgtransport.MigrationSQL(prefix) returns
-- the same statements with another prefix; the transport's Start runs
-- exactly those, and a test checks that both make the same schema.
--
-- Every statement is idempotent, so the file can be run any number of
-- times. Keep every statement a CREATE TABLE / CREATE INDEX ... IF NOT
-- EXISTS (Start checks the catalog for those names and, when all exist,
-- runs no DDL, since DDL locks live tables), ending with ';' at the end of
-- its line and holding no other ';'.

-- +goose Up

-- One row per message per queue. A row is claimable when visible_at has
-- passed; a claim pushes visible_at forward by the lease and counts the
-- delivery, an ack deletes the row, a nack sets visible_at to now plus the
-- redelivery delay.
CREATE TABLE IF NOT EXISTS barewire_queue_messages (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text        NOT NULL,
    message_id  text        NOT NULL DEFAULT '',
    metadata    json        NOT NULL DEFAULT '{}',
    payload     bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    visible_at  timestamptz NOT NULL DEFAULT now(),
    deliveries  integer     NOT NULL DEFAULT 0
) WITH (fillfactor = 90);
CREATE INDEX IF NOT EXISTS barewire_queue_messages_queue_idx ON barewire_queue_messages (queue, id);

-- The declared queues (endpoint queues and error queues), so that a send to
-- a queue nobody declared fails instead of vanishing.
CREATE TABLE IF NOT EXISTS barewire_queues (
    name       text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- (exchange, queue), written by every process at Start, so that a process
-- that does not consume a type still routes it to the endpoints of other
-- processes.
CREATE TABLE IF NOT EXISTS barewire_bindings (
    exchange   text        NOT NULL,
    queue      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (exchange, queue)
);
CREATE INDEX IF NOT EXISTS barewire_bindings_queue_idx ON barewire_bindings (queue);
