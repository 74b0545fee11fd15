package saga_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/saga"
)

// TestRetainFinalized: with RetainFinalized, finalized instances stay in
// Final for the period and RunCleanup deletes them after it; instances in
// other states are never touched, and an event for a deleted instance
// starts a new one.
func TestRetainFinalized(t *testing.T) {
	const retention = 3 * time.Second
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			w := newWorld(t, db, saga.RetainFinalized(retention))
			if w.m.Retention() != retention {
				t.Fatalf("Retention() = %v", w.m.Retention())
			}
			b := w.start(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.m.RunCleanup(ctx, w.db, 20*time.Millisecond, nil) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("RunCleanup: %v", err)
				}
			})
			for _, id := range []string{"r1", "r2", "r3"} {
				w.publish(t, b, Started{ID: id}, uuid.NewString())
			}
			settled(t, 3, b)
			w.publish(t, b, Stopped{ID: "r1"}, uuid.NewString())
			w.publish(t, b, Stopped{ID: "r2"}, uuid.NewString())
			settled(t, 9, b) // 5 events, 4 notes
			final, err := w.m.List(context.Background(), w.db, saga.Final, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(final) != 2 {
				t.Fatalf("List(Final) = %d instances right after finalizing, want 2 (kept for %v)", len(final), retention)
			}
			finalizedAt := final[len(final)-1].UpdatedAt
			deadline := time.Now().Add(retention + 30*time.Second)
			for {
				final, err = w.m.List(context.Background(), w.db, saga.Final, 10)
				if err != nil {
					t.Fatal(err)
				}
				if len(final) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d finalized instances still there %v after the retention period", len(final), time.Since(finalizedAt)-retention)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if age := time.Since(finalizedAt); age < retention {
				t.Errorf("finalized instances deleted %v after finalizing, before the %v retention period", age, retention)
			}
			if c := w.get(t, "r3"); c.CurrentState != "Active" {
				t.Errorf("r3 in %s after cleanup, want Active", c.CurrentState)
			}
			// r1's row is gone: a new start makes a new instance.
			w.publish(t, b, Started{ID: "r1"}, uuid.NewString())
			settled(t, 10, b)
			if c := w.get(t, "r1"); c.CurrentState != "Active" || c.Version != 1 {
				t.Errorf("r1 restarted: state %s version %d, want Active 1", c.CurrentState, c.Version)
			}
		})
	}
}

// TestDeleteFinalizedConcurrent: several cleaners at once (as from several
// processes) delete every old finalized instance exactly once between
// them, without errors, in bounded batches, and nothing else.
func TestDeleteFinalizedConcurrent(t *testing.T) {
	const rows, cleaners, batch = 300, 4, 7
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			w := newWorld(t, db, saga.KeepFinalized())
			w.start(t)
			old := time.Now().UTC().Add(-2 * time.Hour)
			var insts []Counter
			for i := range rows {
				insts = append(insts, Counter{State: saga.State{CorrelationID: fmt.Sprintf("d%03d", i), CurrentState: string(saga.Final), Version: 3, CreatedAt: old, UpdatedAt: old}})
			}
			insts = append(insts,
				Counter{State: saga.State{CorrelationID: "active", CurrentState: "Active", Version: 1, CreatedAt: old, UpdatedAt: old}},
				Counter{State: saga.State{CorrelationID: "recent", CurrentState: string(saga.Final), Version: 1, CreatedAt: old, UpdatedAt: time.Now().UTC()}})
			if err := w.db.Table(w.m.Table()).CreateInBatches(insts, 100).Error; err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			counts := make([]int, cleaners)
			errs := make([]error, cleaners)
			for i := range cleaners {
				wg.Add(1)
				go func() {
					defer wg.Done()
					counts[i], errs[i] = w.m.DeleteFinalized(context.Background(), w.db, time.Hour, batch)
				}()
			}
			wg.Wait()
			total := 0
			for i := range cleaners {
				if errs[i] != nil {
					t.Errorf("cleaner %d: %v", i, errs[i])
				}
				total += counts[i]
			}
			// A cleaner that found only rows others hold stops early; a
			// last pass gets whatever they all left.
			n, err := w.m.DeleteFinalized(context.Background(), w.db, time.Hour, batch)
			if err != nil {
				t.Fatal(err)
			}
			if total+n != rows {
				t.Errorf("cleaners deleted %v (+%d in a last pass), want %d in all", counts, n, rows)
			}
			left, err := w.m.List(context.Background(), w.db, "", 10)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, c := range left {
				ids = append(ids, c.CorrelationID)
			}
			if strings.Join(ids, ",") != "active,recent" {
				t.Errorf("left %v, want the active and the recent instance", ids)
			}
		})
	}
}

// TestRunCleanupErrors: RunCleanup says what is missing instead of running
// a loop that can do nothing.
func TestRunCleanupErrors(t *testing.T) {
	w := newWorld(t, "sqlite")
	ctx := context.Background()
	if err := w.m.RunCleanup(ctx, nil, time.Second, nil); err == nil || !strings.Contains(err.Error(), "saga.RetainFinalized") {
		t.Errorf("without retention: %v", err)
	}
	w = newWorld(t, "sqlite", saga.RetainFinalized(time.Hour))
	if err := w.m.RunCleanup(ctx, nil, 0, nil); err == nil || !strings.Contains(err.Error(), "interval 0s: must be positive") {
		t.Errorf("interval 0: %v", err)
	}
	if err := w.m.RunCleanup(ctx, nil, time.Second, nil); err == nil || !strings.Contains(err.Error(), "db is nil") {
		t.Errorf("nil db: %v", err)
	}
}
