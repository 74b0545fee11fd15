package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/barewire-go/barewire/inbox"
)

// Lock timeouts the suite uses. Short enough to keep the suite quick, long
// enough that a slow CI machine does not see a lock expire by accident.
const (
	shortLock = 300 * time.Millisecond
	longLock  = time.Minute
	// waitLimit bounds every poll for a lock to expire.
	waitLimit = 10 * time.Second
	// pollEvery is the polling period of those waits.
	pollEvery = 25 * time.Millisecond
)

// Run runs the conformance suite. newStore must return an empty store (no
// entries) that is independent of every other store it returned; it may
// register cleanup with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) inbox.Store) {
	t.Helper()
	cases := []struct {
		name string
		fn   func(t *testing.T, s inbox.Store)
	}{
		{"FirstLockWins", testFirstLockWins},
		{"ProcessedIsDuplicate", testProcessedIsDuplicate},
		{"ExpiredLockIsRelockable", testExpiredLockIsRelockable},
		{"ProcessedNeverRelockable", testProcessedNeverRelockable},
		{"ConcurrentLockers", testConcurrentLockers},
		{"ConcurrentRelockAfterExpiry", testConcurrentRelockAfterExpiry},
		{"Fencing", testFencing},
		{"FailureRollsBackAndReleaseFrees", testFailureAndRelease},
		{"PanicRollsBack", testPanicRollsBack},
		{"KeysAreIndependent", testKeysAreIndependent},
		{"ProcessAndLock", testProcessAndLock},
		{"ProcessAndLockFailure", testProcessAndLockFailure},
		{"Cleanup", testCleanup},
		{"List", testList},
		{"Stats", testStats},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, newStore(t))
		})
	}
	for _, c := range batchCases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			b, ok := s.(inbox.BatchStore)
			if !ok {
				t.Skip("the store does not implement inbox.BatchStore")
			}
			c.fn(t, s, b)
		})
	}
	for _, c := range lockProcessCases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			lp, ok := s.(inbox.LockProcessor)
			if !ok {
				t.Skip("the store does not implement inbox.LockProcessor")
			}
			c.fn(t, s, lp)
		})
	}
}

var errBoom = errors.New("inboxtest: handler failed")

// testCtx bounds every case so that a store that blocks fails the test
// instead of hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func key(id, consumer string) inbox.Key {
	return inbox.Key{MessageID: id, ConsumerType: consumer}
}

func mustLock(t *testing.T, ctx context.Context, s inbox.Store, k inbox.Key, timeout time.Duration, want inbox.State) inbox.Lock {
	t.Helper()
	l, err := s.TryLock(ctx, k, timeout)
	if err != nil {
		t.Fatalf("TryLock(%v): %v", k, err)
	}
	if l.State != want {
		t.Fatalf("TryLock(%v) = %v, want %v", k, l.State, want)
	}
	if want == inbox.Acquired && l.Token == "" {
		t.Fatalf("TryLock(%v) acquired without a token", k)
	}
	return l
}

// lockAfterExpiry polls TryLock until it acquires k, which must happen no
// earlier than minWait after start (the holder's lock timeout) and before
// waitLimit. Every attempt before that must report Busy.
func lockAfterExpiry(t *testing.T, ctx context.Context, s inbox.Store, k inbox.Key, timeout time.Duration, start time.Time, minWait time.Duration) inbox.Lock {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		l, err := s.TryLock(ctx, k, timeout)
		if err != nil {
			t.Fatalf("TryLock(%v): %v", k, err)
		}
		switch l.State {
		case inbox.Acquired:
			if waited := time.Since(start); waited < minWait {
				t.Fatalf("TryLock(%v) took over a lock after %v, before its timeout %v", k, waited, minWait)
			}
			if l.Token == "" {
				t.Fatalf("TryLock(%v) acquired without a token", k)
			}
			return l
		case inbox.Busy:
		default:
			t.Fatalf("TryLock(%v) = %v while waiting for expiry, want busy", k, l.State)
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryLock(%v) still busy %v after the lock should have expired", k, waitLimit)
		}
		time.Sleep(pollEvery)
	}
}

func process(t *testing.T, ctx context.Context, s inbox.Store, k inbox.Key, token string) {
	t.Helper()
	called := 0
	err := s.Process(ctx, k, token, func(ctx context.Context) error {
		called++
		return nil
	})
	if err != nil {
		t.Fatalf("Process(%v): %v", k, err)
	}
	if called != 1 {
		t.Fatalf("Process(%v) called fn %d times, want 1", k, called)
	}
}

func entry(t *testing.T, ctx context.Context, s inbox.Store, k inbox.Key) inbox.Entry {
	t.Helper()
	got, err := s.List(ctx, inbox.Query{MessageID: k.MessageID, ConsumerType: k.ConsumerType})
	if err != nil {
		t.Fatalf("List(%v): %v", k, err)
	}
	if len(got) != 1 {
		t.Fatalf("List(%v) returned %d entries, want 1", k, len(got))
	}
	return got[0]
}

func testFirstLockWins(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	first := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
	if first.ExpiresAt.IsZero() {
		t.Fatal("acquired lock has no ExpiresAt")
	}
	second := mustLock(t, ctx, s, k, longLock, inbox.Busy)
	if second.Token != "" {
		t.Errorf("busy lock carries token %q", second.Token)
	}
	if !second.ExpiresAt.Equal(first.ExpiresAt) {
		t.Errorf("busy ExpiresAt = %v, want the holder's %v", second.ExpiresAt, first.ExpiresAt)
	}
	e := entry(t, ctx, s, k)
	if e.ProcessedAt != nil || e.Attempts != 1 || e.ReceivedAt.IsZero() {
		t.Errorf("entry after one lock = %+v, want unprocessed, 1 attempt, received", e)
	}
	if e.ExpiresAt.Sub(e.ReceivedAt) < longLock-time.Second {
		t.Errorf("entry expires %v after it was received, want about %v", e.ExpiresAt.Sub(e.ReceivedAt), longLock)
	}
}

func testProcessedIsDuplicate(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	l := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
	process(t, ctx, s, k, l.Token)
	mustLock(t, ctx, s, k, longLock, inbox.Processed)
	if e := entry(t, ctx, s, k); e.ProcessedAt == nil {
		t.Errorf("entry not processed: %+v", e)
	}
	// The token was consumed by the mark: it cannot mark again.
	err := s.Process(ctx, k, l.Token, func(context.Context) error { return nil })
	if !errors.Is(err, inbox.ErrLockLost) {
		t.Errorf("second Process with a used token = %v, want ErrLockLost", err)
	}
}

func testExpiredLockIsRelockable(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	start := time.Now()
	first := mustLock(t, ctx, s, k, shortLock, inbox.Acquired)
	mustLock(t, ctx, s, k, shortLock, inbox.Busy)
	second := lockAfterExpiry(t, ctx, s, k, longLock, start, shortLock-50*time.Millisecond)
	if second.Token == first.Token {
		t.Fatal("re-lock reused the expired token")
	}
	if !second.ExpiresAt.After(first.ExpiresAt) {
		t.Errorf("re-lock ExpiresAt %v not after the expired %v", second.ExpiresAt, first.ExpiresAt)
	}
	if e := entry(t, ctx, s, k); e.Attempts != 2 {
		t.Errorf("attempts after re-lock = %d, want 2", e.Attempts)
	}
	mustLock(t, ctx, s, k, longLock, inbox.Busy)
	process(t, ctx, s, k, second.Token)
}

func testProcessedNeverRelockable(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	l := mustLock(t, ctx, s, k, shortLock, inbox.Acquired)
	process(t, ctx, s, k, l.Token)
	time.Sleep(shortLock + 200*time.Millisecond) // past the lock's expiry
	mustLock(t, ctx, s, k, shortLock, inbox.Processed)
	if err := s.Release(ctx, k, l.Token); !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Release after processing = %v, want ErrLockLost (the token holds nothing)", err)
	}
	mustLock(t, ctx, s, k, shortLock, inbox.Processed)
	ok, err := s.ProcessAndLock(ctx, k, func(context.Context) error {
		t.Error("ProcessAndLock ran fn for a processed entry")
		return nil
	})
	if err != nil || ok {
		t.Errorf("ProcessAndLock on a processed entry = %v, %v; want false, nil", ok, err)
	}
}

// concurrentTryLock runs n TryLocks of k at once and counts the outcomes.
func concurrentTryLock(t *testing.T, ctx context.Context, s inbox.Store, k inbox.Key, n int) map[inbox.State]int {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results = map[inbox.State]int{}
		errs    []error
		start   = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			l, err := s.TryLock(ctx, k, longLock)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			results[l.State]++
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent TryLock errors: %v", errors.Join(errs...))
	}
	return results
}

func testConcurrentLockers(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	const n = 8
	for i := range 3 {
		k := key(fmt.Sprintf("m%d", i), "consumer")
		got := concurrentTryLock(t, ctx, s, k, n)
		if got[inbox.Acquired] != 1 || got[inbox.Busy] != n-1 {
			t.Fatalf("%d concurrent TryLocks of a new entry: %v, want exactly 1 acquired and %d busy", n, got, n-1)
		}
	}
}

func testConcurrentRelockAfterExpiry(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	const n = 8
	k := key("m1", "consumer")
	mustLock(t, ctx, s, k, shortLock, inbox.Acquired)
	// Wait until the lock has expired in the store's view.
	deadline := time.Now().Add(waitLimit)
	for {
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if st.Expired == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock not expired after %v: %+v", waitLimit, st)
		}
		time.Sleep(pollEvery)
	}
	got := concurrentTryLock(t, ctx, s, k, n)
	if got[inbox.Acquired] != 1 || got[inbox.Busy] != n-1 {
		t.Fatalf("%d concurrent TryLocks of an expired entry: %v, want exactly 1 acquired and %d busy", n, got, n-1)
	}
}

func testFencing(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	start := time.Now()
	stale := mustLock(t, ctx, s, k, shortLock, inbox.Acquired)
	fresh := lockAfterExpiry(t, ctx, s, k, longLock, start, shortLock-50*time.Millisecond)

	// The stale holder finishes its handler late: it must not commit.
	err := s.Process(ctx, k, stale.Token, func(context.Context) error { return nil })
	if !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Process with a taken-over token = %v, want ErrLockLost", err)
	}
	if e := entry(t, ctx, s, k); e.ProcessedAt != nil {
		t.Fatalf("stale holder marked the entry processed: %+v", e)
	}
	// Nor may it release the new holder's lock; it learns that it lost it.
	if err := s.Release(ctx, k, stale.Token); !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Release with a taken-over token = %v, want ErrLockLost", err)
	}
	mustLock(t, ctx, s, k, longLock, inbox.Busy)

	process(t, ctx, s, k, fresh.Token)
	if e := entry(t, ctx, s, k); e.ProcessedAt == nil {
		t.Fatalf("new holder did not mark the entry processed: %+v", e)
	}
	err = s.Process(ctx, k, stale.Token, func(context.Context) error { return nil })
	if !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Process with a stale token after processing = %v, want ErrLockLost", err)
	}
	if err := s.Release(ctx, k, stale.Token); !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Release with a stale token after processing = %v, want ErrLockLost", err)
	}
	mustLock(t, ctx, s, k, longLock, inbox.Processed)
}

func testFailureAndRelease(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	l := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
	err := s.Process(ctx, k, l.Token, func(ctx context.Context) error {
		return fmt.Errorf("wrapped: %w", errBoom)
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Process with a failing fn = %v, want fn's error", err)
	}
	if e := entry(t, ctx, s, k); e.ProcessedAt != nil {
		t.Fatalf("failed Process marked the entry processed: %+v", e)
	}
	// Still locked: the failed delivery holds it until it releases.
	mustLock(t, ctx, s, k, longLock, inbox.Busy)

	// A wrong token releases nothing, and says so.
	if err := s.Release(ctx, k, "not-the-token"); !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Release with a wrong token = %v, want ErrLockLost", err)
	}
	mustLock(t, ctx, s, k, longLock, inbox.Busy)

	if err := s.Release(ctx, k, l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Lockable at once, long before the minute-long lock would expire.
	retry := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
	if retry.Token == l.Token {
		t.Fatal("retry reused the released token")
	}
	// The released token is dead.
	err = s.Process(ctx, k, l.Token, func(context.Context) error { return nil })
	if !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Process with a released token = %v, want ErrLockLost", err)
	}
	process(t, ctx, s, k, retry.Token)
	if e := entry(t, ctx, s, k); e.Attempts != 2 || e.ProcessedAt == nil {
		t.Errorf("entry after failure and retry = %+v, want processed after 2 attempts", e)
	}
}

func testPanicRollsBack(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	l := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
	func() {
		defer func() {
			if r := recover(); r != "inboxtest panic" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_ = s.Process(ctx, k, l.Token, func(context.Context) error { panic("inboxtest panic") })
		t.Fatal("Process swallowed the handler's panic")
	}()
	if e := entry(t, ctx, s, k); e.ProcessedAt != nil {
		t.Fatalf("panicking Process marked the entry processed: %+v", e)
	}
	// The store still works (the transaction was ended), and the lock is
	// still held by the delivery that panicked until it is released.
	mustLock(t, ctx, s, k, longLock, inbox.Busy)
	if err := s.Release(ctx, k, l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	retry := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
	process(t, ctx, s, k, retry.Token)
}

func testKeysAreIndependent(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	a := mustLock(t, ctx, s, key("m1", "c1"), longLock, inbox.Acquired)
	mustLock(t, ctx, s, key("m1", "c2"), longLock, inbox.Acquired)
	mustLock(t, ctx, s, key("m2", "c1"), longLock, inbox.Acquired)
	process(t, ctx, s, key("m1", "c1"), a.Token)
	mustLock(t, ctx, s, key("m1", "c1"), longLock, inbox.Processed)
	mustLock(t, ctx, s, key("m1", "c2"), longLock, inbox.Busy)
	mustLock(t, ctx, s, key("m2", "c1"), longLock, inbox.Busy)
	mustLock(t, ctx, s, key("m2", "c2"), longLock, inbox.Acquired)
	// A token only works for its own key.
	err := s.Process(ctx, key("m1", "c2"), a.Token, func(context.Context) error { return nil })
	if !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Process with another key's token = %v, want ErrLockLost", err)
	}
}

func testProcessAndLock(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	calls := 0
	fn := func(context.Context) error { calls++; return nil }
	ok, err := s.ProcessAndLock(ctx, k, fn)
	if err != nil || !ok || calls != 1 {
		t.Fatalf("first ProcessAndLock = %v, %v (fn called %d times); want true, nil, 1 call", ok, err, calls)
	}
	ok, err = s.ProcessAndLock(ctx, k, fn)
	if err != nil || ok || calls != 1 {
		t.Fatalf("duplicate ProcessAndLock = %v, %v (fn called %d times); want false, nil, no new call", ok, err, calls)
	}
	mustLock(t, ctx, s, k, longLock, inbox.Processed)
	if e := entry(t, ctx, s, k); e.ProcessedAt == nil {
		t.Fatalf("ProcessAndLock did not leave a processed entry: %+v", e)
	}

	// An entry locked by a live two-phase delivery is not taken.
	k2 := key("m2", "consumer")
	mustLock(t, ctx, s, k2, longLock, inbox.Acquired)
	ok, err = s.ProcessAndLock(ctx, k2, fn)
	if err != nil || ok || calls != 1 {
		t.Fatalf("ProcessAndLock on a locked entry = %v, %v (fn called %d times); want false, nil, no call", ok, err, calls)
	}

	// Concurrent deliveries of one key: exactly one runs fn.
	k3 := key("m3", "consumer")
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins int
		errs []error
	)
	start := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			<-start
			ok, err := s.ProcessAndLock(ctx, k3, func(context.Context) error { return nil })
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				wins++
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 || wins != 1 {
		t.Fatalf("4 concurrent ProcessAndLock: %d won, errors %v; want exactly 1 winner", wins, errors.Join(errs...))
	}
}

func testProcessAndLockFailure(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	_, err := s.ProcessAndLock(ctx, k, func(context.Context) error { return errBoom })
	if !errors.Is(err, errBoom) {
		t.Fatalf("ProcessAndLock with a failing fn = %v, want fn's error", err)
	}
	// The insert was rolled back with fn: a retry processes.
	if got, err := s.List(ctx, inbox.Query{MessageID: k.MessageID}); err != nil || len(got) != 0 {
		t.Fatalf("after a failed ProcessAndLock List = %+v, %v; want no entry", got, err)
	}
	ok, err := s.ProcessAndLock(ctx, k, func(context.Context) error { return nil })
	if err != nil || !ok {
		t.Fatalf("retry after failure = %v, %v; want true, nil", ok, err)
	}
}

func testCleanup(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	const retention = time.Second
	// Old rows: three processed, one abandoned (expired, never processed).
	for i := range 3 {
		k := key(fmt.Sprintf("old-%d", i), "consumer")
		l := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
		process(t, ctx, s, k, l.Token)
	}
	mustLock(t, ctx, s, key("abandoned", "consumer"), 100*time.Millisecond, inbox.Acquired)

	time.Sleep(retention + 500*time.Millisecond)

	// Recent rows: processed, expired but within retention, and locked.
	recent := key("recent", "consumer")
	l := mustLock(t, ctx, s, recent, longLock, inbox.Acquired)
	process(t, ctx, s, recent, l.Token)
	mustLock(t, ctx, s, key("expired-recently", "consumer"), 100*time.Millisecond, inbox.Acquired)
	mustLock(t, ctx, s, key("locked", "consumer"), longLock, inbox.Acquired)

	total := 0
	for i, want := range []int{2, 2, 0} {
		n, err := s.Cleanup(ctx, retention, 2)
		if err != nil {
			t.Fatalf("Cleanup #%d: %v", i+1, err)
		}
		if n != want {
			t.Fatalf("Cleanup #%d with batch 2 deleted %d, want %d", i+1, n, want)
		}
		total += n
	}
	got, err := s.List(ctx, inbox.Query{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	kept := map[string]bool{}
	for _, e := range got {
		kept[e.MessageID] = true
	}
	for _, id := range []string{"recent", "expired-recently", "locked"} {
		if !kept[id] {
			t.Errorf("Cleanup deleted %q, which is within retention", id)
		}
	}
	for _, id := range []string{"old-0", "old-1", "old-2", "abandoned"} {
		if kept[id] {
			t.Errorf("Cleanup kept %q, which is past retention", id)
		}
	}
	if len(got) != 3 {
		t.Errorf("after cleanup %d entries remain, want 3", len(got))
	}
	// A cleaned-up abandoned entry is simply new again.
	mustLock(t, ctx, s, key("abandoned", "consumer"), longLock, inbox.Acquired)
}

func testList(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	// Five processed for consumer A, then two locked for consumer B; a small
	// pause between entries gives distinct receive times (SQLite stores
	// milliseconds).
	var order []inbox.Key
	for i := range 5 {
		k := key(fmt.Sprintf("m%d", i), "A")
		l := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
		process(t, ctx, s, k, l.Token)
		order = append(order, k)
		time.Sleep(3 * time.Millisecond)
	}
	for i := range 2 {
		k := key(fmt.Sprintf("m%d", i), "B")
		mustLock(t, ctx, s, k, longLock, inbox.Acquired)
		order = append(order, k)
		time.Sleep(3 * time.Millisecond)
	}

	all, err := s.List(ctx, inbox.Query{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(all) != len(order) {
		t.Fatalf("List returned %d entries, want %d", len(all), len(order))
	}
	for i, e := range all {
		want := order[len(order)-1-i] // newest first
		if e.MessageID != want.MessageID || e.ConsumerType != want.ConsumerType {
			t.Fatalf("List[%d] = %s/%s, want %s/%s (newest received first)", i, e.MessageID, e.ConsumerType, want.MessageID, want.ConsumerType)
		}
		if e.ReceivedAt.IsZero() || e.ExpiresAt.IsZero() || e.Attempts != 1 {
			t.Errorf("List[%d] = %+v: missing times or attempts", i, e)
		}
		if wantProcessed := e.ConsumerType == "A"; (e.ProcessedAt != nil) != wantProcessed {
			t.Errorf("List[%d] = %+v: processed = %v, want %v", i, e, e.ProcessedAt != nil, wantProcessed)
		}
	}

	yes, no := true, false
	for _, c := range []struct {
		q    inbox.Query
		want int
	}{
		{inbox.Query{ConsumerType: "A"}, 5},
		{inbox.Query{ConsumerType: "B"}, 2},
		{inbox.Query{MessageID: "m1"}, 2},
		{inbox.Query{MessageID: "m1", ConsumerType: "B"}, 1},
		{inbox.Query{Processed: &yes}, 5},
		{inbox.Query{Processed: &no}, 2},
		{inbox.Query{Processed: &no, ConsumerType: "A"}, 0},
		{inbox.Query{MessageID: "nope"}, 0},
		{inbox.Query{Limit: 3}, 3},
		{inbox.Query{Offset: 5, Limit: 10}, 2},
		{inbox.Query{Offset: 7}, 0},
	} {
		got, err := s.List(ctx, c.q)
		if err != nil {
			t.Fatalf("List(%+v): %v", c.q, err)
		}
		if len(got) != c.want {
			t.Errorf("List(%+v) returned %d entries, want %d", c.q, len(got), c.want)
		}
	}

	// Pages of 3 concatenate to the full list.
	var paged []inbox.Entry
	for off := 0; ; off += 3 {
		page, err := s.List(ctx, inbox.Query{Offset: off, Limit: 3})
		if err != nil {
			t.Fatalf("List page at %d: %v", off, err)
		}
		paged = append(paged, page...)
		if len(page) < 3 {
			break
		}
	}
	if len(paged) != len(all) {
		t.Fatalf("paging returned %d entries, want %d", len(paged), len(all))
	}
	for i := range all {
		if paged[i].MessageID != all[i].MessageID || paged[i].ConsumerType != all[i].ConsumerType {
			t.Fatalf("page entry %d = %s/%s, want %s/%s", i, paged[i].MessageID, paged[i].ConsumerType, all[i].MessageID, all[i].ConsumerType)
		}
	}
}

func testStats(t *testing.T, s inbox.Store) {
	ctx := testCtx(t)
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st != (inbox.Stats{}) {
		t.Fatalf("Stats of an empty store = %+v", st)
	}
	for i := range 2 {
		k := key(fmt.Sprintf("processed-%d", i), "consumer")
		l := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
		process(t, ctx, s, k, l.Token)
	}
	mustLock(t, ctx, s, key("locked", "consumer"), longLock, inbox.Acquired)
	released := mustLock(t, ctx, s, key("released", "consumer"), longLock, inbox.Acquired)
	if err := s.Release(ctx, key("released", "consumer"), released.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	mustLock(t, ctx, s, key("expiring", "consumer"), 100*time.Millisecond, inbox.Acquired)

	want := inbox.Stats{Locked: 1, Expired: 2} // the 2 processed entries are not counted
	deadline := time.Now().Add(waitLimit)
	for {
		st, err = s.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if st == want {
			return
		}
		// Until the short lock expires it counts as locked.
		if st != (inbox.Stats{Locked: 2, Expired: 1}) || time.Now().After(deadline) {
			t.Fatalf("Stats = %+v, want %+v", st, want)
		}
		time.Sleep(pollEvery)
	}
}
