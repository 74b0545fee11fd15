// Package xactwatch finds out when PostgreSQL transactions that wrote
// messages commit, so that the notification (NOTIFY) and the local
// wake-ups can be sent after the commit, outside those transactions.
//
// A transaction that runs NOTIFY takes a database-wide lock at pre-commit
// and holds it until its commit record is flushed, so notifying
// transactions commit one at a time and lose group commit. The writers
// (the outbox's Add, the PostgreSQL transport's DeliverTx) therefore only
// record their transaction id (pg_current_xact_id, returned by the same
// INSERT) and hand it to a Watcher, which asks pg_xact_status for every
// watched id in one query while it has any.
//
// The goroutine runs only while there are transactions to watch: Add
// starts it, it exits when the set is empty, and Close stops it for good.
// Nothing may depend on it for correctness — the consumers of what those
// transactions wrote must poll — only for how soon they hear of a commit.
package xactwatch

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is the watcher's timing.
type Config struct {
	// FirstCheck is how long after Add a transaction is first checked;
	// every check that finds it still in progress doubles its interval,
	// up to MaxInterval.
	FirstCheck, MaxInterval time.Duration
	// MinGap is the least time between two status queries, however many
	// transactions are due: under load, one query every MinGap covers
	// them all.
	MinGap time.Duration
	// Expiry drops a transaction still in progress after this long (a
	// prepared transaction may stay so for ever): the poll of whoever
	// reads its rows finds them once it commits.
	Expiry time.Duration
	// MaxPending caps the transactions watched at once; Add never waits
	// for room, the ones over the cap rely on the poll.
	MaxPending int
}

// DefaultConfig suits a poll of about a second behind it.
var DefaultConfig = Config{
	FirstCheck:  2 * time.Millisecond,
	MaxInterval: time.Second,
	MinGap:      5 * time.Millisecond,
	Expiry:      time.Minute,
	MaxPending:  4096,
}

// Status is what pg_xact_status says of a transaction.
type Status int

// Statuses. Unknown (pg_xact_status returned NULL: too old to know) ends
// the watch like Aborted.
const (
	InProgress Status = iota
	Committed
	Aborted
	Unknown
)

// ParseStatus reads pg_xact_status's text ("" for NULL).
func ParseStatus(s string) Status {
	switch s {
	case "in progress":
		return InProgress
	case "committed":
		return Committed
	case "aborted":
		return Aborted
	}
	return Unknown
}

// Query reports the status of the transactions in xids, given as a
// PostgreSQL array literal of xid8 values ("{7,9}"): cast it with
// CAST(CAST($1 AS text) AS xid8[]). It may do more in the same statement
// (the outbox sends its NOTIFY there). A transaction missing from the
// result counts as in progress.
type Query func(ctx context.Context, xids string) (map[uint64]Status, error)

// Watcher watches transactions until they end. It is safe for concurrent
// use.
type Watcher struct {
	cfg      Config
	query    Query
	onCommit func(tags []any)

	mu      sync.Mutex
	pending map[uint64]*watched
	running bool
	closed  bool
	// kick tells a sleeping goroutine that a transaction was added (it
	// may be due before the one the goroutine sleeps for).
	kick    chan struct{}
	stopCtx context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup

	queries   atomic.Int64
	commits   atomic.Int64
	overflow  atomic.Int64
	expired   atomic.Int64
	errs      atomic.Int64
	lastError atomic.Value // string
}

type watched struct {
	added    time.Time
	next     time.Time
	interval time.Duration
	tags     []any
}

// New returns a watcher that asks query and calls onCommit, from its own
// goroutine, with the tags of the transactions each check found committed
// (one call per check that found any; tags may be empty when Add was given
// none).
func New(cfg Config, query Query, onCommit func(tags []any)) *Watcher {
	ctx, cancel := context.WithCancel(context.Background())
	return &Watcher{
		cfg: cfg, query: query, onCommit: onCommit,
		pending: map[uint64]*watched{}, kick: make(chan struct{}, 1),
		stopCtx: ctx, stop: cancel,
	}
}

// Add watches the transaction xid (text, as PostgreSQL prints an xid8),
// with tags to hand to onCommit. A second Add of the same transaction adds
// its tags. It never blocks on the database.
func (w *Watcher) Add(xid string, tags ...any) {
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
	if p, ok := w.pending[x]; ok {
		p.tags = append(p.tags, tags...)
		w.mu.Unlock()
		return
	}
	if len(w.pending) >= w.cfg.MaxPending {
		w.mu.Unlock()
		w.overflow.Add(1)
		return
	}
	w.pending[x] = &watched{added: now, next: now.Add(w.cfg.FirstCheck), interval: w.cfg.FirstCheck, tags: tags}
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

// SetTiming changes the timing (for tests); zero fields keep theirs. Call
// it before the first Add.
func (w *Watcher) SetTiming(c Config) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := func(p *time.Duration, v time.Duration) {
		if v > 0 {
			*p = v
		}
	}
	set(&w.cfg.FirstCheck, c.FirstCheck)
	set(&w.cfg.MaxInterval, c.MaxInterval)
	set(&w.cfg.MinGap, c.MinGap)
	set(&w.cfg.Expiry, c.Expiry)
	if c.MaxPending > 0 {
		w.cfg.MaxPending = c.MaxPending
	}
}

// Close stops the goroutine and waits for it. Transactions still watched
// are left to the poll; later Adds are not watched. It is idempotent.
func (w *Watcher) Close() {
	w.mu.Lock()
	w.closed = true
	clear(w.pending)
	w.mu.Unlock()
	w.stop()
	w.wg.Wait()
}

func (w *Watcher) run() {
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
		gap := w.cfg.MinGap
		w.mu.Unlock()
		if earliest := lastQuery.Add(gap); due.Before(earliest) {
			due = earliest
		}
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-w.stopCtx.Done():
				// Close cleared the set and no goroutine starts again.
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

// check asks for the status of every watched transaction in one query.
func (w *Watcher) check() {
	w.mu.Lock()
	var lit strings.Builder
	lit.WriteByte('{')
	first := true
	for x := range w.pending {
		if !first {
			lit.WriteByte(',')
		}
		first = false
		lit.WriteString(strconv.FormatUint(x, 10))
	}
	lit.WriteByte('}')
	w.mu.Unlock()

	w.queries.Add(1)
	st, err := w.query(w.stopCtx, lit.String())
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
	var tags []any
	committed := false
	w.mu.Lock()
	for x, p := range w.pending {
		s, ok := st[x]
		switch {
		case !ok || s == InProgress:
			if p.next.After(now) {
				continue // not due yet: checked only because another one was
			}
			w.backOff(x, p, now)
		case s == Committed:
			committed = true
			tags = append(tags, p.tags...)
			delete(w.pending, x)
		default: // aborted or unknown: done
			delete(w.pending, x)
		}
	}
	w.mu.Unlock()
	if committed {
		w.commits.Add(1)
		if w.onCommit != nil {
			w.onCommit(tags)
		}
	}
}

// backOff doubles p's interval, or drops it once expired; w.mu is held.
func (w *Watcher) backOff(x uint64, p *watched, now time.Time) {
	if now.Sub(p.added) >= w.cfg.Expiry {
		delete(w.pending, x)
		w.expired.Add(1)
		return
	}
	p.interval = min(2*p.interval, w.cfg.MaxInterval)
	p.next = now.Add(p.interval)
}

// Stats are the watcher's counters, for tests and diagnostics.
type Stats struct {
	// Queries counts status queries; Commits the queries that found at
	// least one commit (and called onCommit).
	Queries, Commits int64
	// Overflow counts transactions not watched because the set was full,
	// Expired those dropped while still in progress, Errors failed
	// queries.
	Overflow, Expired, Errors int64
	Pending                   int
	Running                   bool
	LastError                 string
}

// Stats returns the counters.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	n, running := len(w.pending), w.running
	w.mu.Unlock()
	last, _ := w.lastError.Load().(string)
	return Stats{
		Queries: w.queries.Load(), Commits: w.commits.Load(), Overflow: w.overflow.Load(),
		Expired: w.expired.Load(), Errors: w.errs.Load(), Pending: n, Running: running, LastError: last,
	}
}
