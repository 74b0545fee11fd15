package xactwatch_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/barewire-go/barewire/internal/xactwatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDB answers status queries from a map the test changes.
type fakeDB struct {
	mu      sync.Mutex
	status  map[uint64]xactwatch.Status
	queries int
	fail    error
}

func (f *fakeDB) set(x uint64, s xactwatch.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[x] = s
}

func (f *fakeDB) query(_ context.Context, lit string) (map[uint64]xactwatch.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queries++
	if f.fail != nil {
		return nil, f.fail
	}
	out := map[uint64]xactwatch.Status{}
	for _, s := range strings.Split(strings.Trim(lit, "{}"), ",") {
		x, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, err
		}
		st, ok := f.status[x]
		if !ok {
			st = xactwatch.InProgress
		}
		out[x] = st
	}
	return out, nil
}

func fast() xactwatch.Config {
	return xactwatch.Config{FirstCheck: time.Millisecond, MaxInterval: 20 * time.Millisecond, MinGap: time.Millisecond, Expiry: time.Minute, MaxPending: 100}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCommittedTagsReachOnCommitAbortedOnesDoNot(t *testing.T) {
	db := &fakeDB{status: map[uint64]xactwatch.Status{}}
	got := make(chan []any, 10)
	w := xactwatch.New(fast(), db.query, func(tags []any) { got <- tags })
	defer w.Close()

	w.Add("7", "a", "b")
	w.Add("7", "c") // the same transaction again: its tags add up
	w.Add("9", "x")
	w.Add("not-an-xid", "ignored")
	db.set(9, xactwatch.Aborted)
	db.set(7, xactwatch.Committed)
	tags := <-got
	slices.SortFunc(tags, func(a, b any) int { return strings.Compare(a.(string), b.(string)) })
	if !slices.Equal(tags, []any{"a", "b", "c"}) {
		t.Fatalf("tags %v, want a b c (and nothing of the aborted transaction)", tags)
	}
	waitUntil(t, "watch set empty and goroutine gone", func() bool { st := w.Stats(); return st.Pending == 0 && !st.Running })
	select {
	case more := <-got:
		t.Fatalf("onCommit called again with %v", more)
	default:
	}
	// Watching again restarts the goroutine.
	w.Add("11", "y")
	db.set(11, xactwatch.Committed)
	if tags := <-got; len(tags) != 1 || tags[0] != "y" {
		t.Fatalf("after restart: %v", tags)
	}
}

// A transaction that stays open is checked less and less often, then
// dropped at Expiry; the queries stay few.
func TestLongTransactionBacksOffAndExpires(t *testing.T) {
	db := &fakeDB{status: map[uint64]xactwatch.Status{}}
	cfg := fast()
	cfg.MaxInterval = 100 * time.Millisecond
	cfg.Expiry = 500 * time.Millisecond
	w := xactwatch.New(cfg, db.query, nil)
	defer w.Close()
	w.Add("5")
	waitUntil(t, "expired", func() bool { return w.Stats().Expired == 1 })
	st := w.Stats()
	// 1, 2, 4, ... 64 ms then every 100 ms over 500 ms: about 10 queries.
	if st.Queries < 4 || st.Queries > 16 || st.Pending != 0 {
		t.Fatalf("stats %+v; want a handful of queries over 500ms, then nothing watched", st)
	}
}

func TestCapAndErrorsAndClose(t *testing.T) {
	db := &fakeDB{status: map[uint64]xactwatch.Status{}, fail: errors.New("connection refused")}
	cfg := fast()
	cfg.MaxPending = 2
	w := xactwatch.New(cfg, db.query, func([]any) { t.Error("onCommit after failed queries") })
	w.Add("1")
	w.Add("2")
	w.Add("3") // over the cap: left to the poll
	waitUntil(t, "a failed query", func() bool { return w.Stats().Errors > 0 })
	st := w.Stats()
	if st.Overflow != 1 || st.Pending != 2 || st.LastError != "connection refused" {
		t.Fatalf("stats %+v", st)
	}
	w.Close()
	w.Close() // idempotent
	w.Add("4")
	if st := w.Stats(); st.Pending != 0 || st.Running {
		t.Fatalf("after Close: %+v", st)
	}
}

func TestParseStatus(t *testing.T) {
	for in, want := range map[string]xactwatch.Status{
		"in progress": xactwatch.InProgress, "committed": xactwatch.Committed, "aborted": xactwatch.Aborted, "": xactwatch.Unknown,
	} {
		if got := xactwatch.ParseStatus(in); got != want {
			t.Errorf("ParseStatus(%q) = %v, want %v", in, got, want)
		}
	}
}
