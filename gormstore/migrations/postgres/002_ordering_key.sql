-- BareWire outbox: migration 002, the ordering key (docs/ordering.md).
--
-- A goose migration and a plain SQL script, like 001. The relay claims a
-- row with an ordering key only when no older pending row has the same key
-- (a per-key FIFO claim), so messages of one key leave in the order they
-- were written even with several relays; rows without a key (the column is
-- NULL) are claimed as before.

-- +goose Up

ALTER TABLE barewire_outbox ADD COLUMN IF NOT EXISTS ordering_key text;
-- The claim's per-key look-up of older pending rows; it holds only pending
-- rows that have a key, so it costs nothing when ordering is not used.
CREATE INDEX IF NOT EXISTS barewire_outbox_key_idx
    ON barewire_outbox (ordering_key, id) WHERE status = 'pending' AND ordering_key IS NOT NULL;
