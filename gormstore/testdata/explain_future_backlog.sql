-- The claim with 1,000,000 scheduled rows in the future (docs/benchmarks.md).
-- Run, from the repository root, on a scratch database:
--   sed 's/barewire_/xp_/g' gormstore/migrations/postgres/001_init.sql | psql "$DSN" -q
--   psql "$DSN" -f gormstore/testdata/explain_future_backlog.sql
--   psql "$DSN" -c 'DROP TABLE xp_outbox, xp_inbox'
-- The future rows get the LOWEST ids, the worst case for a claim that
-- walks pending rows in id order: 100 due rows sit behind them.
\timing off
TRUNCATE xp_outbox;
INSERT INTO xp_outbox (message_id, destination, payload, available_at)
SELECT 'future-' || g, 'queue:reminders', '\x7b7d', now() + interval '1 hour' + g * interval '1 second'
FROM generate_series(1, 1000000) AS g;
INSERT INTO xp_outbox (message_id, destination, payload)
SELECT 'due-' || g, 'queue:reminders', '\x7b7d' FROM generate_series(1, 100) AS g;
VACUUM ANALYZE xp_outbox;

\echo '== the claim as the store sends it (ORDER BY available_at, id on xp_outbox_due_idx)'
BEGIN;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
WITH claimed AS (
SELECT id FROM xp_outbox WHERE status = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until < now())
ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE xp_outbox AS o SET locked_by = 'explain-probe', locked_until = (now() + make_interval(secs => 60))
FROM claimed WHERE o.id = claimed.id
RETURNING o.id;
ROLLBACK;

\echo '== the relay''s next-due lookup'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT CAST(EXTRACT(EPOCH FROM (MIN(available_at) - now())) AS double precision) AS secs
FROM xp_outbox WHERE status = 'pending' AND available_at > now();

\echo '== cancel by message id (rolled back)'
BEGIN;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
DELETE FROM xp_outbox WHERE message_id = 'future-500000' AND status = 'pending'
AND (locked_until IS NULL OR locked_until < now());
ROLLBACK;

\echo '== for comparison: the previous claim (ORDER BY id on a partial index (id))'
BEGIN;
DROP INDEX xp_outbox_due_idx;
CREATE INDEX xp_outbox_pending_idx ON xp_outbox (id) WHERE status = 'pending';
ANALYZE xp_outbox;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
WITH claimed AS (
SELECT id FROM xp_outbox WHERE status = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until < now())
ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE xp_outbox AS o SET locked_by = 'explain-probe', locked_until = (now() + make_interval(secs => 60))
FROM claimed WHERE o.id = claimed.id
RETURNING o.id;
ROLLBACK;
