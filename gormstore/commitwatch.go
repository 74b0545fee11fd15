package gormstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/barewire-go/barewire/internal/xactwatch"
)

// commitWatch finds out when the transactions that added outbox rows on
// PostgreSQL commit (an xactwatch.Watcher), and then sends one NOTIFY for
// all of them, outside their transactions, and wakes this store's
// listeners directly.
//
// It exists because a transaction that runs NOTIFY takes a database-wide
// lock at pre-commit and holds it until its commit record is flushed, so
// notifying transactions commit one at a time and lose group commit (see
// package xactwatch). Nothing depends on it for correctness — relays poll
// every PollingInterval — only how soon a relay hears of a commit.
type commitWatch struct {
	*xactwatch.Watcher
	// token is the payload of this watcher's notifications, so that
	// Listen on this Outbox can skip the ones it was already woken for.
	token string

	mu     sync.Mutex
	wakers map[int]func()
	nextID int

	notifies atomic.Int64 // status queries that also sent a NOTIFY
}

func newCommitWatch(o *Outbox, cfg xactwatch.Config) *commitWatch {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	w := &commitWatch{token: "bw-" + hex.EncodeToString(b), wakers: map[int]func(){}}
	w.Watcher = xactwatch.New(cfg, func(ctx context.Context, xids string) (map[uint64]xactwatch.Status, error) {
		return w.query(ctx, o, xids)
	}, func([]any) { w.wake() })
	return w
}

// query runs the watcher's one statement: the status of every watched
// transaction and, when any of them committed, the NOTIFY.
func (w *commitWatch) query(ctx context.Context, o *Outbox, xids string) (map[uint64]xactwatch.Status, error) {
	var rows []struct {
		Xid      string  `gorm:"column:xid"`
		Status   *string `gorm:"column:status"`
		Notified int64   `gorm:"column:notified"`
	}
	if err := o.s.db.WithContext(ctx).Raw(o.watchSQL, xids, o.channel, w.token).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[uint64]xactwatch.Status, len(rows))
	for _, r := range rows {
		x, err := strconv.ParseUint(r.Xid, 10, 64)
		if err != nil {
			continue
		}
		st := ""
		if r.Status != nil {
			st = *r.Status
		}
		out[x] = xactwatch.ParseStatus(st)
	}
	if len(rows) > 0 && rows[0].Notified > 0 {
		w.notifies.Add(1)
	}
	return out, nil
}

// add watches the transaction xid (text, as PostgreSQL prints an xid8).
// It never blocks on the database.
func (w *commitWatch) add(xid string) { w.Add(xid) }

// addWaker registers wake to be called after commits are seen; the
// returned function unregisters it.
func (w *commitWatch) addWaker(wake func()) func() {
	w.mu.Lock()
	id := w.nextID
	w.nextID++
	w.wakers[id] = wake
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.wakers, id)
		w.mu.Unlock()
	}
}

func (w *commitWatch) wake() {
	w.mu.Lock()
	wakers := make([]func(), 0, len(w.wakers))
	for _, wake := range w.wakers {
		wakers = append(wakers, wake)
	}
	w.mu.Unlock()
	for _, wake := range wakers {
		wake()
	}
}

// close stops the watcher. Transactions still watched are left to the
// relays' poll; later Adds are not watched.
func (w *commitWatch) close() { w.Close() }

// watchStats are the watcher's counters (exported to tests through
// export_test.go).
type watchStats struct {
	Queries, Notifies, Overflow, Expired, Errors int64
	Pending                                      int
	Running                                      bool
	LastError                                    string
}

func (w *commitWatch) stats() watchStats {
	st := w.Stats()
	return watchStats{
		Queries: st.Queries, Notifies: w.notifies.Load(), Overflow: st.Overflow, Expired: st.Expired,
		Errors: st.Errors, Pending: st.Pending, Running: st.Running, LastError: st.LastError,
	}
}
