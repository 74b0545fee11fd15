package gormstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// testClock runs with the real clock and jumps ahead on advance.
type testClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// TestWithClockDecidesByTheGoClock: with WithClock every time decision in
// SQL (inbox lock expiry, retention, relay lease) reads the Go clock, and
// the lock token still guards the mark of a delivery taken over.
func TestWithClockDecidesByTheGoClock(t *testing.T) {
	clk := &testClock{}
	s, db := sqliteBackend().newStore(t, gormstore.WithClock(clk.now))
	ctx := context.Background()
	in := s.Inbox()
	key := inbox.Key{MessageID: "m1", ConsumerType: "billing"}

	crashed, err := in.TryLock(ctx, key, time.Hour)
	if err != nil || crashed.State != inbox.Acquired {
		t.Fatalf("first lock: %+v %v", crashed, err)
	}
	if got, want := crashed.ExpiresAt, clk.now().Add(time.Hour); got.Before(want.Add(-time.Minute)) || got.After(want.Add(time.Minute)) {
		t.Fatalf("lock expires at %v, want about %v (the Go clock plus the timeout)", got, want)
	}
	if l, err := in.TryLock(ctx, key, time.Hour); err != nil || l.State != inbox.Busy {
		t.Fatalf("second lock before expiry: %+v %v, want busy", l, err)
	}
	clk.advance(time.Hour + time.Second)
	taken, err := in.TryLock(ctx, key, time.Hour)
	if err != nil || taken.State != inbox.Acquired {
		t.Fatalf("lock after the clock passed its expiry: %+v %v, want acquired", taken, err)
	}
	if err := in.Process(ctx, key, crashed.Token, func(context.Context) error { return nil }); !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("mark with the taken-over token: %v, want ErrLockLost", err)
	}
	if err := in.Process(ctx, key, taken.Token, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("mark with the new token: %v", err)
	}

	// Retention: the entry is an hour old only by the Go clock.
	if n, err := in.Cleanup(ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("cleanup before retention: %d %v", n, err)
	}
	clk.advance(2 * time.Hour)
	if n, err := in.Cleanup(ctx, time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("cleanup after the clock passed retention: deleted %d (%v), want 1", n, err)
	}

	// Relay lease: a claimed row is claimable again once the lease expires
	// by the Go clock.
	ob := s.Outbox()
	if err := db.Transaction(func(tx *gorm.DB) error {
		return ob.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{{MessageID: "o1", Destination: "queue:x", MessageType: "T", Payload: []byte("{}")}})
	}); err != nil {
		t.Fatalf("add: %v", err)
	}
	if got, err := ob.Claim(ctx, "relay-a", 10, time.Minute); err != nil || len(got) != 1 {
		t.Fatalf("first claim: %d rows, %v", len(got), err)
	}
	if got, err := ob.Claim(ctx, "relay-b", 10, time.Minute); err != nil || len(got) != 0 {
		t.Fatalf("claim under a live lease: %d rows, %v", len(got), err)
	}
	clk.advance(time.Minute + time.Second)
	if got, err := ob.Claim(ctx, "relay-b", 10, time.Minute); err != nil || len(got) != 1 {
		t.Fatalf("claim after the lease expired by the Go clock: %d rows, %v, want 1", len(got), err)
	}
}

func TestWithClockRejectedOnPostgres(t *testing.T) {
	b := postgresBackend(t)
	_, err := gormstore.New(b.db, gormstore.WithClock(time.Now))
	if err == nil || !strings.Contains(err.Error(), "WithClock is supported on SQLite only") {
		t.Fatalf("New with WithClock on PostgreSQL: %v, want the SQLite-only error", err)
	}
}
