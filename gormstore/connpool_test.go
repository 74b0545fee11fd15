package gormstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// The inbox's and the outbox's hot-path statements run on GORM's
// connection pool directly (not through GORM's statement builder): on the
// pool of a *gorm.DB in prepared-statement mode too, inside and outside its
// transactions, with the lock token still guarding the mark.
func TestHotPathStatementsOnPreparedStatementPool(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		plain, db := b.newStore(t)
		prepared := db.Session(&gorm.Session{PrepareStmt: true})
		s, err := gormstore.New(prepared, gormstore.WithTablePrefix(plain.TablePrefix()))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()

		// The outbox insert in a prepared-statement transaction, one and
		// several messages.
		for _, n := range []int{1, 3} {
			msgs := make([]*outbox.Message, n)
			for i := range msgs {
				msgs[i] = &outbox.Message{MessageID: "m-" + time.Now().Format("150405.000000000"), Destination: "queue:q", Payload: []byte("x"), Headers: map[string]string{"k": "v"}}
			}
			if err := prepared.Transaction(func(tx *gorm.DB) error {
				return s.Outbox().Add(gormstore.WithTx(ctx, tx), msgs)
			}); err != nil {
				t.Fatalf("Add %d: %v", n, err)
			}
			for i, m := range msgs {
				if m.ID == 0 || m.CreatedAt.IsZero() || m.Status != outbox.StatusPending {
					t.Fatalf("Add %d: message %d not filled in: %+v", n, i, m)
				}
				if i > 0 && m.ID <= msgs[i-1].ID {
					t.Fatalf("Add %d: ids not in order: %d after %d", n, m.ID, msgs[i-1].ID)
				}
			}
		}
		st, err := s.Outbox().Stats(ctx)
		if err != nil || st.Pending != 4 {
			t.Fatalf("outbox Stats = %+v, %v; want 4 pending", st, err)
		}

		// Lock, process, then the same key is a duplicate.
		key := inbox.Key{MessageID: "in-1", ConsumerType: "c"}
		lock, err := s.Inbox().TryLock(ctx, key, time.Minute)
		if err != nil || lock.State != inbox.Acquired || lock.Token == "" || lock.ExpiresAt.IsZero() {
			t.Fatalf("TryLock = %+v, %v; want acquired with a token and expiry", lock, err)
		}
		busy, err := s.Inbox().TryLock(ctx, key, time.Minute)
		if err != nil || busy.State != inbox.Busy {
			t.Fatalf("second TryLock = %+v, %v; want busy", busy, err)
		}
		ran := false
		if err := s.Inbox().Process(ctx, key, lock.Token, func(ctx context.Context) error {
			_, ok := gormstore.TxFromContext(ctx)
			ran = ok
			return nil
		}); err != nil || !ran {
			t.Fatalf("Process = %v (ran in a transaction: %v)", err, ran)
		}
		if again, err := s.Inbox().TryLock(ctx, key, time.Minute); err != nil || again.State != inbox.Processed {
			t.Fatalf("TryLock after Process = %+v, %v; want processed", again, err)
		}

		// A stale token cannot mark; release frees the entry at once.
		key2 := inbox.Key{MessageID: "in-2", ConsumerType: "c"}
		lock2, err := s.Inbox().TryLock(ctx, key2, time.Minute)
		if err != nil || lock2.State != inbox.Acquired {
			t.Fatalf("TryLock in-2 = %+v, %v", lock2, err)
		}
		if err := s.Inbox().Process(ctx, key2, "not-the-token", func(context.Context) error { return nil }); !errors.Is(err, inbox.ErrLockLost) {
			t.Fatalf("Process with a stale token = %v; want ErrLockLost", err)
		}
		if err := s.Inbox().Release(ctx, key2, lock2.Token); err != nil {
			t.Fatal(err)
		}
		if re, err := s.Inbox().TryLock(ctx, key2, time.Minute); err != nil || re.State != inbox.Acquired {
			t.Fatalf("TryLock after Release = %+v, %v; want acquired", re, err)
		}

		// Single transaction: first claims, second is a duplicate.
		key3 := inbox.Key{MessageID: "in-3", ConsumerType: "c"}
		for i, want := range []bool{true, false} {
			done, err := s.Inbox().ProcessAndLock(ctx, key3, func(context.Context) error { return nil })
			if err != nil || done != want {
				t.Fatalf("ProcessAndLock #%d = %v, %v; want %v", i+1, done, err, want)
			}
		}
	})
}
