package gormstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Commit watcher tuning. A variable so that tests can shorten it.
var defaultWatchConfig = watchConfig{
	firstCheck:  2 * time.Millisecond,
	maxInterval: time.Second, // outbox.DefaultPollingInterval: past it, the relays' poll is as quick
	minGap:      5 * time.Millisecond,
	expiry:      time.Minute,
	maxPending:  4096,
}

type watchConfig struct {
	// firstCheck is how long after Add a transaction is first checked;
	// every check that finds it still in progress doubles its interval, up
	// to maxInterval.
	firstCheck, maxInterval time.Duration
	// minGap is the least time between two status queries, however many
	// transactions are due: under load, one query every minGap covers them
	// all.
	minGap time.Duration
	// expiry drops a transaction still in progress after this long (a
	// prepared transaction may stay so for ever): the relays' poll finds
	// its rows once it commits.
	expiry time.Duration
	// maxPending caps the transactions watched at once; Add never waits
	// for room, the ones over the cap rely on the poll.
	maxPending int
}

// commitWatch finds out when the transactions that added outbox rows on
// PostgreSQL commit, and then sends one NOTIFY for all of them, outside
// their transactions, and wakes this process's listeners directly.
//
// It exists because a transaction that runs NOTIFY takes a database-wide
// lock at pre-commit and holds it until its commit record is flushed, so
// notifying transactions commit one at a time and lose group commit. The
// producers' transactions therefore only record their id
// (pg_current_xact_id, returned by the INSERT), and this watcher polls
// pg_xact_status for those ids while it has any.
//
// The goroutine runs only while there are transactions to watch: Add starts
// it, it exits when the set is empty, and Close stops it for good. Nothing
// depends on it for correctness — relays poll every PollingInterval — only
// how soon a relay in another process hears of a commit.
type commitWatch struct {
	o   *Outbox
	cfg watchConfig
	// token is the payload of this watcher's notifications, so that
	// Listen on this Outbox can skip the ones it was already woken for.
	token string

	mu      sync.Mutex
	pending map[uint64]*watchedXact
	running bool
	closed  bool
	wakers  map[int]func()
	nextID  int
	// kick tells a sleeping goroutine that a transaction was added (it may
	// be due before the one the goroutine sleeps for).
	kick chan struct{}
	// stopCtx is cancelled by close; wg tracks the goroutine.
	stopCtx context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup

	// Counters, for tests and diagnostics.
	queries   atomic.Int64 // status queries sent
	notifies  atomic.Int64 // status queries that also sent a NOTIFY
	overflow  atomic.Int64 // transactions not watched because the set was full
	expired   atomic.Int64 // transactions dropped while still in progress
	errs      atomic.Int64 // failed status queries
	lastError atomic.Value // string
}

type watchedXact struct {
	added    time.Time
	next     time.Time
	interval time.Duration
}

func newCommitWatch(o *Outbox, cfg watchConfig) *commitWatch {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	ctx, cancel := context.WithCancel(context.Background())
	return &commitWatch{
		o: o, cfg: cfg, token: "bw-" + hex.EncodeToString(b),
		pending: map[uint64]*watchedXact{},
		wakers:  map[int]func(){},
		kick:    make(chan struct{}, 1),
		stopCtx: ctx, stop: cancel,
	}
}

// add watches the transaction xid (text, as PostgreSQL prints an xid8). It
// never blocks on the database.
func (w *commitWatch) add(xid string) {
	x, err := strconv.ParseUint(xid, 10, 64)
	if err != nil {
		return // not an xid: nothing to watch, the poll covers it
	}
	now := time.Now()
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	if _, ok := w.pending[x]; ok {
		// A second Add in the same transaction.
		w.mu.Unlock()
		return
	}
	if len(w.pending) >= w.cfg.maxPending {
		w.mu.Unlock()
		w.overflow.Add(1)
		return
	}
	w.pending[x] = &watchedXact{added: now, next: now.Add(w.cfg.firstCheck), interval: w.cfg.firstCheck}
	start := !w.running
	w.running = true
	if start {
		w.wg.Add(1)
	}
	w.mu.Unlock()
	if start {
		go w.run()
		return
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

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

// close stops the goroutine and waits for it. Transactions still watched
// are left to the relays' poll; later Adds are not watched.
func (w *commitWatch) close() {
	w.mu.Lock()
	w.closed = true
	clear(w.pending)
	w.mu.Unlock()
	w.stop()
	w.wg.Wait()
}

func (w *commitWatch) run() {
	defer w.wg.Done()
	var lastQuery time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		if w.closed || len(w.pending) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		due := time.Time{}
		for _, p := range w.pending {
			if due.IsZero() || p.next.Before(due) {
				due = p.next
			}
		}
		w.mu.Unlock()
		if earliest := lastQuery.Add(w.cfg.minGap); due.Before(earliest) {
			due = earliest
		}
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-w.stopCtx.Done():
				// close cleared the set and no goroutine starts again.
				w.mu.Lock()
				w.running = false
				w.mu.Unlock()
				return
			case <-w.kick:
				timer.Stop() // Go 1.23+ timers: no stale tick after Stop
				continue     // a new transaction may be due sooner
			case <-timer.C:
			}
		}
		lastQuery = time.Now()
		w.check()
	}
}

// check queries the status of every watched transaction in one statement,
// which also sends the NOTIFY when any of them committed.
func (w *commitWatch) check() {
	w.mu.Lock()
	xids := make([]uint64, 0, len(w.pending))
	for x := range w.pending {
		xids = append(xids, x)
	}
	w.mu.Unlock()
	var lit strings.Builder
	lit.WriteByte('{')
	for i, x := range xids {
		if i > 0 {
			lit.WriteByte(',')
		}
		lit.WriteString(strconv.FormatUint(x, 10))
	}
	lit.WriteByte('}')

	var rows []struct {
		Xid      string  `gorm:"column:xid"`
		Status   *string `gorm:"column:status"`
		Notified int64   `gorm:"column:notified"`
	}
	w.queries.Add(1)
	err := w.o.s.db.WithContext(w.stopCtx).Raw(w.o.watchSQL, lit.String(), w.o.channel, w.token).Scan(&rows).Error
	now := time.Now()
	if err != nil {
		if w.stopCtx.Err() != nil {
			return
		}
		w.errs.Add(1)
		w.lastError.Store(err.Error())
		w.mu.Lock()
		if strings.Contains(err.Error(), "database is closed") {
			// The pool is gone for good: nothing can be checked any more.
			clear(w.pending)
		}
		for x, p := range w.pending {
			w.backOff(x, p, now)
		}
		w.mu.Unlock()
		return
	}
	committed := false
	w.mu.Lock()
	for _, r := range rows {
		x, err := strconv.ParseUint(r.Xid, 10, 64)
		if err != nil {
			continue
		}
		p, ok := w.pending[x]
		if !ok {
			continue
		}
		switch {
		case r.Status == nil || *r.Status != "in progress":
			// committed, aborted, or too old to know (NULL): done.
			delete(w.pending, x)
			committed = committed || (r.Status != nil && *r.Status == "committed")
		default:
			w.backOff(x, p, now)
		}
	}
	var wakers []func()
	if committed {
		wakers = make([]func(), 0, len(w.wakers))
		for _, wake := range w.wakers {
			wakers = append(wakers, wake)
		}
	}
	w.mu.Unlock()
	if committed {
		if len(rows) > 0 && rows[0].Notified > 0 {
			w.notifies.Add(1)
		}
		for _, wake := range wakers {
			wake()
		}
	}
}

// backOff doubles p's interval, or drops it once expired; w.mu is held.
func (w *commitWatch) backOff(x uint64, p *watchedXact, now time.Time) {
	if now.Sub(p.added) >= w.cfg.expiry {
		delete(w.pending, x)
		w.expired.Add(1)
		return
	}
	p.interval = min(2*p.interval, w.cfg.maxInterval)
	p.next = now.Add(p.interval)
}

// watchStats are the watcher's counters (exported to tests through
// export_test.go).
type watchStats struct {
	Queries, Notifies, Overflow, Expired, Errors int64
	Pending                                      int
	Running                                      bool
	LastError                                    string
}

func (w *commitWatch) stats() watchStats {
	w.mu.Lock()
	n, running := len(w.pending), w.running
	w.mu.Unlock()
	last, _ := w.lastError.Load().(string)
	return watchStats{
		Queries: w.queries.Load(), Notifies: w.notifies.Load(), Overflow: w.overflow.Load(),
		Expired: w.expired.Load(), Errors: w.errs.Load(), Pending: n, Running: running, LastError: last,
	}
}
