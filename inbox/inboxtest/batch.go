package inboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/barewire-go/barewire/inbox"
)

// batchCases run when the store implements inbox.BatchStore.
var batchCases = []struct {
	name string
	fn   func(t *testing.T, s inbox.Store, b inbox.BatchStore)
}{
	{"BatchLockStates", testBatchLockStates},
	{"BatchFailureIsolated", testBatchFailureIsolated},
	{"BatchFencing", testBatchFencing},
	{"BatchTimeBound", testBatchTimeBound},
	{"BatchPanicRollsBack", testBatchPanicRollsBack},
}

func lockBatch(t *testing.T, ctx context.Context, b inbox.BatchStore, consumer string, ids []string, timeout time.Duration) []inbox.Lock {
	t.Helper()
	locks, err := b.TryLockBatch(ctx, consumer, ids, timeout)
	if err != nil {
		t.Fatalf("TryLockBatch(%v): %v", ids, err)
	}
	if len(locks) != len(ids) {
		t.Fatalf("TryLockBatch(%v) returned %d locks, want %d", ids, len(locks), len(ids))
	}
	return locks
}

// items builds one batch item per lock, each counting its calls in calls.
func items(ids []string, locks []inbox.Lock, calls map[string]int, fail map[string]error) []inbox.BatchItem {
	out := make([]inbox.BatchItem, len(ids))
	for i, id := range ids {
		out[i] = inbox.BatchItem{MessageID: id, Token: locks[i].Token, Ctx: context.Background(), Fn: func(context.Context) error {
			calls[id]++
			return fail[id]
		}}
	}
	return out
}

func testBatchLockStates(t *testing.T, s inbox.Store, b inbox.BatchStore) {
	ctx := testCtx(t)
	done := mustLock(t, ctx, s, key("done", "c"), longLock, inbox.Acquired)
	process(t, ctx, s, key("done", "c"), done.Token)
	mustLock(t, ctx, s, key("held", "c"), longLock, inbox.Acquired)

	ids := []string{"new", "done", "new", "held", "other"}
	locks := lockBatch(t, ctx, b, "c", ids, longLock)
	want := []inbox.State{inbox.Acquired, inbox.Processed, inbox.Busy, inbox.Busy, inbox.Acquired}
	for i, l := range locks {
		if l.State != want[i] {
			t.Fatalf("TryLockBatch(%v)[%d] = %v, want %v", ids, i, l.State, want[i])
		}
	}
	if locks[0].Token == "" || locks[4].Token == "" || locks[0].Token == locks[4].Token {
		t.Fatalf("acquired locks need distinct tokens, got %q and %q", locks[0].Token, locks[4].Token)
	}
	// The batch's locks are real locks.
	mustLock(t, ctx, s, key("new", "c"), longLock, inbox.Busy)
	mustLock(t, ctx, s, key("other", "c"), longLock, inbox.Busy)
	// Another consumer type is another entry.
	if l := lockBatch(t, ctx, b, "c2", []string{"new"}, longLock); l[0].State != inbox.Acquired {
		t.Fatalf("TryLockBatch for another consumer type = %v, want acquired", l[0].State)
	}
}

func testBatchFailureIsolated(t *testing.T, s inbox.Store, b inbox.BatchStore) {
	ctx := testCtx(t)
	ids := []string{"m1", "m2", "m3"}
	locks := lockBatch(t, ctx, b, "c", ids, longLock)
	calls := map[string]int{}
	errs := b.ProcessBatch(ctx, "c", items(ids, locks, calls, map[string]error{"m2": errBoom}), time.Time{})
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], errBoom) {
		t.Fatalf("ProcessBatch = %v, want [nil, errBoom, nil]", errs)
	}
	for _, id := range ids {
		if calls[id] != 1 {
			t.Fatalf("fn of %s ran %d times, want 1", id, calls[id])
		}
	}
	for _, id := range []string{"m1", "m3"} {
		if e := entry(t, ctx, s, key(id, "c")); e.ProcessedAt == nil {
			t.Fatalf("%s's neighbour failed and it was not marked processed: %+v", id, e)
		}
		mustLock(t, ctx, s, key(id, "c"), longLock, inbox.Processed)
	}
	if e := entry(t, ctx, s, key("m2", "c")); e.ProcessedAt != nil {
		t.Fatalf("the failed item was marked processed: %+v", e)
	}
	// Released with the commit: its retry locks at once.
	retry := mustLock(t, ctx, s, key("m2", "c"), longLock, inbox.Acquired)
	process(t, ctx, s, key("m2", "c"), retry.Token)
}

func testBatchFencing(t *testing.T, s inbox.Store, b inbox.BatchStore) {
	ctx := testCtx(t)
	start := time.Now()
	stale := lockBatch(t, ctx, b, "c", []string{"m1"}, shortLock)[0]
	rest := lockBatch(t, ctx, b, "c", []string{"m2", "m3"}, longLock)
	fresh := lockAfterExpiry(t, ctx, s, key("m1", "c"), longLock, start, shortLock-50*time.Millisecond)

	ids := []string{"m2", "m1", "m3"}
	locks := []inbox.Lock{rest[0], stale, rest[1]}
	calls := map[string]int{}
	errs := b.ProcessBatch(ctx, "c", items(ids, locks, calls, nil), time.Time{})
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], inbox.ErrLockLost) {
		t.Fatalf("ProcessBatch with a taken-over lock = %v, want [nil, ErrLockLost, nil]", errs)
	}
	if calls["m1"] != 0 {
		t.Fatal("the fenced item's fn ran")
	}
	if e := entry(t, ctx, s, key("m1", "c")); e.ProcessedAt != nil {
		t.Fatalf("the stale holder marked the entry processed: %+v", e)
	}
	// The new holder keeps its lock and commits.
	mustLock(t, ctx, s, key("m1", "c"), longLock, inbox.Busy)
	process(t, ctx, s, key("m1", "c"), fresh.Token)
	for _, id := range []string{"m2", "m3"} {
		mustLock(t, ctx, s, key(id, "c"), longLock, inbox.Processed)
	}
}

func testBatchTimeBound(t *testing.T, s inbox.Store, b inbox.BatchStore) {
	ctx := testCtx(t)
	ids := []string{"m1", "m2", "m3"}
	locks := lockBatch(t, ctx, b, "c", ids, longLock)
	calls := map[string]int{}
	// A bound already passed: the first item runs, the others wait.
	errs := b.ProcessBatch(ctx, "c", items(ids, locks, calls, nil), time.Now())
	if errs[0] != nil || !errors.Is(errs[1], inbox.ErrNotStarted) || !errors.Is(errs[2], inbox.ErrNotStarted) {
		t.Fatalf("ProcessBatch past its bound = %v, want [nil, ErrNotStarted, ErrNotStarted]", errs)
	}
	if calls["m2"]+calls["m3"] != 0 {
		t.Fatal("an item not started ran")
	}
	mustLock(t, ctx, s, key("m1", "c"), longLock, inbox.Processed)
	// The others keep their locks for the next batch.
	mustLock(t, ctx, s, key("m2", "c"), longLock, inbox.Busy)
	errs = b.ProcessBatch(ctx, "c", items(ids[1:], locks[1:], calls, nil), time.Time{})
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("the next batch = %v, want [nil, nil]", errs)
	}
	mustLock(t, ctx, s, key("m3", "c"), longLock, inbox.Processed)
}

func testBatchPanicRollsBack(t *testing.T, s inbox.Store, b inbox.BatchStore) {
	ctx := testCtx(t)
	ids := []string{"m1", "m2"}
	locks := lockBatch(t, ctx, b, "c", ids, longLock)
	its := items(ids, locks, map[string]int{}, nil)
	its[1].Fn = func(context.Context) error { panic("inboxtest panic") }
	func() {
		defer func() {
			if r := recover(); r != "inboxtest panic" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		b.ProcessBatch(ctx, "c", its, time.Time{})
		t.Fatal("ProcessBatch swallowed the handler's panic")
	}()
	// Nothing committed, and every lock is free for the retries.
	for _, id := range ids {
		if e := entry(t, ctx, s, key(id, "c")); e.ProcessedAt != nil {
			t.Fatalf("a panicking batch marked %s processed: %+v", id, e)
		}
		retry := mustLock(t, ctx, s, key(id, "c"), longLock, inbox.Acquired)
		process(t, ctx, s, key(id, "c"), retry.Token)
	}
}
