package gormstore_test

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/testenv"
)

// TestInboxLockNeverWaitsOnAHeldRow (issue 32, defect 1): an inbox entry
// whose row another transaction holds (a group-commit batch's fence, an
// instance frozen with its transaction open) made every lock attempt of
// another delivery wait in SQL without limit. Each lock statement now
// gives up after a second and reports the entry busy; TryLock,
// TryLockBatch and the pipelined LockAndProcess alike.
func TestInboxLockNeverWaitsOnAHeldRow(t *testing.T) {
	db := postgresBackend(t).db
	prefix := randomPrefix(t)
	t.Cleanup(func() { dropTables(t, db, prefix) })
	s := migrated(t, db, gormstore.WithTablePrefix(prefix))
	defer s.Close()
	in := s.Inbox()
	ctx := context.Background()
	key := inbox.Key{MessageID: "held", ConsumerType: "c"}
	// A lock that expires at once: without the held row, a new delivery
	// would take it over.
	if l, err := in.TryLock(ctx, key, time.Millisecond); err != nil || l.State != inbox.Acquired {
		t.Fatalf("first lock: %+v, %v", l, err)
	}
	time.Sleep(5 * time.Millisecond)
	release := testenv.HoldInTransaction(t, db, func(tx *gorm.DB) error {
		return tx.Exec("SELECT 1 FROM "+prefix+"inbox WHERE message_id = ? AND consumer_type = ? FOR UPDATE", key.MessageID, key.ConsumerType).Error
	})
	defer func() {
		if err := release(); err != nil {
			t.Error(err)
		}
	}()
	// Deadlines far beyond the bound: without it, each call fails with its
	// deadline instead of answering busy.
	bounded := func(name string, call func(ctx context.Context) (inbox.State, error)) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		start := time.Now()
		st, err := call(ctx)
		took := time.Since(start)
		if err != nil || st != inbox.Busy {
			t.Errorf("%s on a held row: %v, %v after %v; want busy", name, st, err, took)
		}
		if took > 5*time.Second {
			t.Errorf("%s took %v on a held row; want about a second", name, took)
		}
	}
	bounded("TryLock", func(ctx context.Context) (inbox.State, error) {
		l, err := in.TryLock(ctx, key, time.Minute)
		return l.State, err
	})
	bounded("TryLockBatch", func(ctx context.Context) (inbox.State, error) {
		ls, err := in.TryLockBatch(ctx, key.ConsumerType, []string{"free", key.MessageID}, time.Minute)
		if err != nil {
			return 0, err
		}
		return ls[1].State, nil
	})
	bounded("LockAndProcess", func(ctx context.Context) (inbox.State, error) {
		ran := false
		l, err := in.LockAndProcess(ctx, key, time.Minute, func(context.Context) error { ran = true; return nil })
		if ran {
			t.Error("LockAndProcess ran the consumer on a held row")
		}
		return l.State, err
	})
}
