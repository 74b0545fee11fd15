package gormstore_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
)

// pgListener is a LISTEN session on its own connection, as a relay in
// another process has.
type pgListener struct {
	conn *pgx.Conn
	ch   chan *pgconn.Notification
}

func listenOn(t *testing.T, channel string) *pgListener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, os.Getenv(postgresDSNEnv))
	if err != nil {
		cancel()
		t.Fatalf("connect: %v", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		cancel()
		t.Fatalf("LISTEN: %v", err)
	}
	l := &pgListener{conn: conn, ch: make(chan *pgconn.Notification, 100)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			l.ch <- n
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return l
}

// marker sends a notification with payload from yet another session. A
// LISTEN session receives notifications in commit order, so whatever was
// notified before the marker committed arrives before it.
func marker(t *testing.T, db *gorm.DB, channel, payload string) {
	t.Helper()
	if err := db.Exec("SELECT pg_notify(?, ?)", channel, payload).Error; err != nil {
		t.Fatalf("marker: %v", err)
	}
}

// next returns the next notification, failing after timeout.
func (l *pgListener) next(t *testing.T, timeout time.Duration, what string) *pgconn.Notification {
	t.Helper()
	select {
	case n := <-l.ch:
		return n
	case <-time.After(timeout):
		t.Fatalf("no notification within %v: %s", timeout, what)
		return nil
	}
}

// waitFor polls cond (the watcher has no signal to wait on).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// openTx runs a transaction that adds one message and stays open until the
// returned function is called with whether to commit; it reports the
// transaction's backend pid. The transaction's connection stays out of the
// pool until the test ends, so that nothing else runs on its backend.
func openTx(t *testing.T, db *gorm.DB, out *gormstore.Outbox, id string) (pid int64, finish func(commit bool)) {
	t.Helper()
	added := make(chan error, 1)
	decide := make(chan bool)
	done := make(chan error, 1)
	release := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = db.Connection(func(conn *gorm.DB) error {
			done <- conn.Transaction(func(tx *gorm.DB) error {
				if err := tx.Raw("SELECT pg_backend_pid()").Scan(&pid).Error; err != nil {
					added <- err
					return err
				}
				err := out.Add(gormstore.WithTx(context.Background(), tx), []*outbox.Message{{MessageID: id, Destination: "queue:q"}})
				added <- err
				if err != nil {
					return err
				}
				if !<-decide {
					return errors.New("roll back")
				}
				return nil
			})
			<-release
			return nil
		})
	}()
	if err := <-added; err != nil {
		close(release)
		t.Fatalf("Add: %v", err)
	}
	var once sync.Once
	finish = func(commit bool) {
		once.Do(func() {
			decide <- commit
			err := <-done
			if commit && err != nil {
				t.Errorf("commit: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		finish(false)
		close(release)
		<-exited
	})
	return pid, finish
}

// TestCommitNotifiesFromOutsideTheTransaction: the producer's transaction
// runs no NOTIFY; the notification comes after its commit, from another
// backend, and a rolled-back transaction is not notified.
func TestCommitNotifiesFromOutsideTheTransaction(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	out := s.Outbox()
	channel := s.TablePrefix() + "outbox"
	l := listenOn(t, channel)

	pid, finish := openTx(t, db, out, "m-1")
	// The watcher has looked at the open transaction (twice) and sent
	// nothing: the marker is the first notification.
	q0 := out.WatchStats().Queries
	waitFor(t, "two status checks", func() bool { return out.WatchStats().Queries >= q0+2 })
	marker(t, db, channel, "before-commit")
	if n := l.next(t, 5*time.Second, "marker"); n.Payload != "before-commit" {
		t.Fatalf("notified before the commit: pid %d payload %q", n.PID, n.Payload)
	}

	start := time.Now()
	finish(true)
	n := l.next(t, 2*time.Second, "after the commit")
	t.Logf("commit → notification in %v", time.Since(start))
	if n.PID == uint32(pid) {
		t.Fatalf("the notification came from the producer's own backend (pid %d): its transaction ran NOTIFY", pid)
	}
	waitFor(t, "the watcher to stop", func() bool { st := out.WatchStats(); return !st.Running && st.Pending == 0 })

	// Rolled back: the watcher sees it aborted and notifies nobody.
	q0 = out.WatchStats().Queries
	_, finish = openTx(t, db, out, "m-2")
	finish(false)
	waitFor(t, "the aborted transaction to be checked", func() bool {
		st := out.WatchStats()
		return st.Queries > q0 && st.Pending == 0 && !st.Running
	})
	marker(t, db, channel, "after-rollback")
	if n := l.next(t, 5*time.Second, "marker"); n.Payload != "after-rollback" {
		t.Fatalf("a rolled-back transaction was notified: pid %d payload %q", n.PID, n.Payload)
	}
	if st := out.WatchStats(); st.Notifies != 1 || st.Errors != 0 {
		t.Fatalf("watcher stats %+v: want exactly 1 notification and no errors", st)
	}
}

// TestCommitsAreCoalesced: many transactions committed together cost few
// notifications, and each wakes another process's Listen.
func TestCommitsAreCoalesced(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	out := s.Outbox()
	// Another Store on the same tables stands for another process.
	other, err := gormstore.New(db, gormstore.WithTablePrefix(s.TablePrefix()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	woken := make(chan struct{}, 1000)
	listenDone := make(chan error, 1)
	go func() { listenDone <- other.Outbox().Listen(ctx, func() { woken <- struct{}{} }) }()
	defer func() {
		cancel()
		if err := <-listenDone; err != nil {
			t.Errorf("Listen: %v", err)
		}
	}()
	// Listen has no ready signal: commit until it wakes.
	waitFor(t, "the other store to listen", func() bool {
		if err := inTx(db)(ctx, func(ctx context.Context) error {
			return out.Add(ctx, []*outbox.Message{{MessageID: "probe", Destination: "queue:q"}})
		}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-woken:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	})
	waitFor(t, "the watcher to stop", func() bool { return !out.WatchStats().Running })
	for len(woken) > 0 {
		<-woken
	}

	// Fewer than the pool's 20 connections: each holds one, Listen and the
	// watcher need theirs.
	const n = 10
	finishes := make([]func(bool), n)
	for i := range finishes {
		_, finishes[i] = openTx(t, db, out, "c-"+string(rune('a'+i)))
	}
	before := out.WatchStats().Notifies
	var wg sync.WaitGroup
	for _, f := range finishes {
		wg.Go(func() { f(true) })
	}
	wg.Wait()
	select {
	case <-woken:
	case <-time.After(2 * time.Second):
		t.Fatal("the other store's Listen was not woken after the commits")
	}
	waitFor(t, "the watcher to stop", func() bool { return !out.WatchStats().Running })
	if got := out.WatchStats().Notifies - before; got < 1 || got > n/2 {
		t.Fatalf("%d commits sent %d notifications; want them coalesced", n, got)
	}
}

// TestCommitWatcherBacksOff: a transaction left open is checked less and
// less often, not in a hot loop, and dropped after the expiry.
func TestCommitWatcherBacksOff(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	out := s.Outbox()
	out.SetWatchTiming(200*time.Millisecond, 1500*time.Millisecond, 0)

	_, finish := openTx(t, db, out, "long")
	q0 := out.WatchStats().Queries
	time.Sleep(time.Second) // a measuring window, not a synchronisation
	q := out.WatchStats().Queries - q0
	// 2, 4, 8, ... ms then every 200 ms: about 10 checks in the first
	// second. A loop without back-off would make about 200 (every 5 ms).
	t.Logf("%d status checks in 1s for one open transaction", q)
	if q < 3 || q > 15 {
		t.Fatalf("%d status checks in 1s for one open transaction; want 3..15", q)
	}
	// After the expiry (1.5 s) it is dropped and the goroutine ends.
	waitFor(t, "the open transaction to expire", func() bool {
		st := out.WatchStats()
		return st.Expired == 1 && st.Pending == 0 && !st.Running
	})
	finish(true)
}

// TestCommitWatcherCap: past the cap, Add does not wait and the extra
// transactions are left to the poll.
func TestCommitWatcherCap(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	out := s.Outbox()
	out.SetWatchTiming(0, 0, 2)
	var finishes []func(bool)
	for _, id := range []string{"a", "b", "c"} {
		_, f := openTx(t, db, out, id)
		finishes = append(finishes, f)
	}
	if st := out.WatchStats(); st.Pending != 2 || st.Overflow != 1 {
		t.Fatalf("watcher stats %+v; want 2 pending and 1 over the cap", st)
	}
	for _, f := range finishes {
		f(true)
	}
	waitFor(t, "the watcher to stop", func() bool { st := out.WatchStats(); return st.Pending == 0 && !st.Running })
	if st, err := out.Stats(context.Background()); err != nil || st.Pending != 3 {
		t.Fatalf("Stats = %+v, %v; want 3 pending rows", st, err)
	}
}

// TestCloseStopsCommitWatcher: Close stops the watcher with transactions
// still open, and later Adds start nothing.
func TestCloseStopsCommitWatcher(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	out := s.Outbox()
	_, finish := openTx(t, db, out, "open")
	if st := out.WatchStats(); !st.Running || st.Pending != 1 {
		t.Fatalf("watcher stats %+v; want it running with 1 pending", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st := out.WatchStats(); st.Running || st.Pending != 0 {
		t.Fatalf("watcher stats after Close %+v; want it stopped", st)
	}
	finish(true)
	_, finish = openTx(t, db, out, "after-close")
	if st := out.WatchStats(); st.Running || st.Pending != 0 {
		t.Fatalf("watcher stats after an Add after Close %+v; want it stopped", st)
	}
	finish(true)
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestSQLiteHasNoCommitWatcher(t *testing.T) {
	s, db := sqliteBackend().newStore(t)
	if err := inTx(db)(context.Background(), func(ctx context.Context) error {
		return s.Outbox().Add(ctx, []*outbox.Message{{MessageID: "m", Destination: "queue:q"}})
	}); err != nil {
		t.Fatal(err)
	}
	if st := s.Outbox().WatchStats(); st != (gormstore.WatchStats{}) {
		t.Fatalf("watcher stats on SQLite %+v; want none", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
