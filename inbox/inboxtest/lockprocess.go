package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/barewire-go/barewire/inbox"
)

// lockProcessCases run when the store implements inbox.LockProcessor.
var lockProcessCases = []struct {
	name string
	fn   func(t *testing.T, s inbox.Store, lp inbox.LockProcessor)
}{
	{"LockAndProcessCommits", testLockAndProcessCommits},
	{"LockAndProcessBusy", testLockAndProcessBusy},
	{"LockAndProcessFailure", testLockAndProcessFailure},
	{"LockAndProcessPanic", testLockAndProcessPanic},
	{"LockAndProcessTakesOverExpired", testLockAndProcessTakesOverExpired},
}

func testLockAndProcessCommits(t *testing.T, s inbox.Store, lp inbox.LockProcessor) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	calls := 0
	l, err := lp.LockAndProcess(ctx, k, longLock, func(context.Context) error { calls++; return nil })
	if err != nil || l.State != inbox.Acquired || l.Token == "" || calls != 1 {
		t.Fatalf("LockAndProcess = %+v, %v after %d calls; want acquired with a token, nil, 1 call", l, err, calls)
	}
	if e := entry(t, ctx, s, k); e.ProcessedAt == nil || e.Attempts != 1 {
		t.Fatalf("entry after LockAndProcess = %+v, want processed after 1 attempt", e)
	}
	// A duplicate: fn does not run.
	l, err = lp.LockAndProcess(ctx, k, longLock, func(context.Context) error { calls++; return nil })
	if err != nil || l.State != inbox.Processed || calls != 1 {
		t.Fatalf("LockAndProcess of a processed entry = %+v, %v after %d calls; want processed, nil, 1 call", l, err, calls)
	}
	// The same for TryLock; a stale token cannot mark it again.
	mustLock(t, ctx, s, k, longLock, inbox.Processed)
}

func testLockAndProcessBusy(t *testing.T, s inbox.Store, lp inbox.LockProcessor) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	held := mustLock(t, ctx, s, k, longLock, inbox.Acquired)
	l, err := lp.LockAndProcess(ctx, k, longLock, func(context.Context) error {
		t.Error("fn ran although another delivery holds the lock")
		return nil
	})
	if err != nil || l.State != inbox.Busy {
		t.Fatalf("LockAndProcess of a held entry = %+v, %v; want busy, nil", l, err)
	}
	process(t, ctx, s, k, held.Token)
}

func testLockAndProcessFailure(t *testing.T, s inbox.Store, lp inbox.LockProcessor) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	l, err := lp.LockAndProcess(ctx, k, longLock, func(context.Context) error { return fmt.Errorf("wrapped: %w", errBoom) })
	if !errors.Is(err, errBoom) || l.State != inbox.Acquired || l.Token == "" {
		t.Fatalf("LockAndProcess with a failing fn = %+v, %v; want acquired with a token and fn's error", l, err)
	}
	if e := entry(t, ctx, s, k); e.ProcessedAt != nil {
		t.Fatalf("failed LockAndProcess marked the entry processed: %+v", e)
	}
	// The lock committed on its own: still held until released.
	mustLock(t, ctx, s, k, longLock, inbox.Busy)
	if err := s.Release(ctx, k, l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	calls := 0
	retry, err := lp.LockAndProcess(ctx, k, longLock, func(context.Context) error { calls++; return nil })
	if err != nil || retry.State != inbox.Acquired || calls != 1 || retry.Token == l.Token {
		t.Fatalf("LockAndProcess after release = %+v, %v after %d calls; want acquired with a new token, nil, 1 call", retry, err, calls)
	}
	if e := entry(t, ctx, s, k); e.ProcessedAt == nil || e.Attempts != 2 {
		t.Fatalf("entry after failure and retry = %+v, want processed after 2 attempts", e)
	}
}

func testLockAndProcessPanic(t *testing.T, s inbox.Store, lp inbox.LockProcessor) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	func() {
		defer func() {
			if r := recover(); r != "inboxtest panic" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_, _ = lp.LockAndProcess(ctx, k, longLock, func(context.Context) error { panic("inboxtest panic") })
		t.Fatal("LockAndProcess swallowed the handler's panic")
	}()
	if e := entry(t, ctx, s, k); e.ProcessedAt != nil {
		t.Fatalf("panicking LockAndProcess marked the entry processed: %+v", e)
	}
	// The store still works, and the lock is held by the delivery that
	// panicked.
	mustLock(t, ctx, s, k, longLock, inbox.Busy)
}

func testLockAndProcessTakesOverExpired(t *testing.T, s inbox.Store, lp inbox.LockProcessor) {
	ctx := testCtx(t)
	k := key("m1", "consumer")
	start := time.Now()
	stale := mustLock(t, ctx, s, k, shortLock, inbox.Acquired)
	deadline := time.Now().Add(waitLimit)
	for {
		calls := 0
		l, err := lp.LockAndProcess(ctx, k, longLock, func(context.Context) error { calls++; return nil })
		if err != nil {
			t.Fatalf("LockAndProcess: %v", err)
		}
		if l.State == inbox.Acquired {
			if waited := time.Since(start); waited < shortLock-50*time.Millisecond {
				t.Fatalf("LockAndProcess took over a lock after %v, before its timeout %v", waited, shortLock)
			}
			if calls != 1 {
				t.Fatalf("fn ran %d times, want 1", calls)
			}
			break
		}
		if l.State != inbox.Busy || calls != 0 {
			t.Fatalf("LockAndProcess while the lock runs = %+v after %d calls, want busy and no call", l, calls)
		}
		if time.Now().After(deadline) {
			t.Fatalf("LockAndProcess still busy %v after the lock should have expired", waitLimit)
		}
		time.Sleep(pollEvery)
	}
	// The stale holder cannot commit any more.
	err := s.Process(ctx, k, stale.Token, func(context.Context) error { return nil })
	if !errors.Is(err, inbox.ErrLockLost) {
		t.Fatalf("Process with a taken-over token = %v, want ErrLockLost", err)
	}
	if e := entry(t, ctx, s, k); e.ProcessedAt == nil || e.Attempts != 2 {
		t.Fatalf("entry = %+v, want processed after 2 attempts", e)
	}
}
