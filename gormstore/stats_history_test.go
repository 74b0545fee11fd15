package gormstore_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestStatsCostIsFlatInHistory (issue 33, item 8): health checks and
// metric scrapes read Outbox.Stats and Inbox.Stats, which used to count
// every delivered outbox row and every processed inbox entry kept for the
// retention period (316 ms for one call with 200k of each and 200k
// scheduled rows). With 1,000,000 delivered rows and 1,000,000 processed
// entries (BAREWIRE_STATS_HISTORY_ROWS overrides the number), both calls
// together must take at most 50 ms, and still count what needs attention.
func TestStatsCostIsFlatInHistory(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	rows := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("BAREWIRE_STATS_HISTORY_ROWS")); err == nil && v > 0 {
		rows = v
	}
	p := s.TablePrefix()
	began := time.Now()
	for _, q := range []string{
		`INSERT INTO ` + p + `outbox (message_id, destination, payload, status, delivered_at)
		 SELECT 'history-' || g, 'queue:q', '\x00'::bytea, 'delivered', now() FROM generate_series(1, ?) g`,
		`INSERT INTO ` + p + `inbox (message_id, consumer_type, received_at, processed_at, expires_at)
		 SELECT 'history-' || g, 'consumer', now(), now(), now() FROM generate_series(1, ?) g`,
	} {
		if err := db.Exec(q, rows).Error; err != nil {
			t.Fatal(err)
		}
	}
	// What needs attention: 3 pending, 2 parked, 1 locked, 1 expired.
	for _, q := range []string{
		`INSERT INTO ` + p + `outbox (message_id, destination, payload) SELECT 'now-' || g, 'queue:q', '\x00'::bytea FROM generate_series(1, 3) g`,
		`INSERT INTO ` + p + `outbox (message_id, destination, payload, status, attempts, last_error) SELECT 'parked-' || g, 'queue:q', '\x00'::bytea, 'parked', 10, 'x' FROM generate_series(1, 2) g`,
		`INSERT INTO ` + p + `inbox (message_id, consumer_type, received_at, expires_at, lock_token) VALUES ('locked', 'consumer', now(), now() + interval '1 hour', 't')`,
		`INSERT INTO ` + p + `inbox (message_id, consumer_type, received_at, expires_at, lock_token) VALUES ('expired', 'consumer', now(), now() - interval '1 hour', 't')`,
		// As autovacuum would have by the time history is this large.
		`VACUUM ANALYZE ` + p + `outbox`,
		`VACUUM ANALYZE ` + p + `inbox`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("filled %d delivered rows and %d processed entries in %v", rows, rows, time.Since(began).Round(time.Millisecond))

	ctx := context.Background()
	var took []time.Duration
	for range 7 {
		start := time.Now()
		ost, err := s.Outbox().Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ist, err := s.Inbox().Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
		if ost.Pending != 3 || ost.Parked != 2 || ist.Locked != 1 || ist.Expired != 1 {
			t.Fatalf("outbox %+v, inbox %+v; want 3 pending, 2 parked, 1 locked, 1 expired", ost, ist)
		}
	}
	slices.Sort(took)
	median := took[len(took)/2]
	t.Logf("Outbox.Stats + Inbox.Stats with %d rows of history each: median %v (min %v, max %v)", rows, median, took[0], took[len(took)-1])
	if median > 50*time.Millisecond {
		t.Errorf("Stats took %v (median of %d) with %d rows of history: health and metrics must not scan history (at most 50ms)", median, len(took), rows)
	}
}
