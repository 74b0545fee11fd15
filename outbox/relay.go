package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/barewire-go/barewire/internal/batchdel"
)

// Defaults, matching BareWire's where it has the option.
const (
	DefaultPollingInterval   = time.Second
	DefaultDispatchBatchSize = 100
	DefaultRetention         = 7 * 24 * time.Hour
	DefaultCleanupInterval   = time.Hour
	DefaultMaxAttempts       = 10
	DefaultLease             = time.Minute
	DefaultRelayWorkers      = 2
)

// Relay moves committed outbox rows to the transport. Any number of relays
// may run against one database: each batch is held by (or leased to) one relay, and rows
// are marked delivered only after the transport confirmed them.
type Relay struct {
	// Store is claimed through ClaimBatch: its own ClaimBatch when it is
	// a BatchClaimer, ClaimLeased otherwise. A store whose held batches would keep
	// a connection the Transport needs (a transport writing to the same
	// database pool) should be given with ClaimBatch hidden, wrapped as
	// struct{ outbox.Store }{s} (the bus does so for the PostgreSQL
	// transport).
	Store     Store
	Transport Transport
	// Owner identifies this relay in leases; unique per process.
	Owner string
	// PollingInterval is the safety-net poll when no wake-up arrives. An
	// idle relay sleeps less when a scheduled row falls due sooner
	// (Store.NextDue).
	PollingInterval time.Duration
	// BatchSize is how many rows one claim takes (DispatchBatchSize).
	BatchSize int
	// Workers is how many batches are in flight at once. Defaults to 2.
	Workers int
	// Lease is how long a claimed batch is reserved (ClaimBatch's hold,
	// or the lease of ClaimLeased): a relay that stops answering mid-batch
	// loses its rows after it. Keep it at least
	// twice the transport's publish timeout. Defaults to 1m.
	Lease time.Duration
	// MaxAttempts parks a row after this many failed deliveries.
	MaxAttempts int
	// DeleteOnDeliver deletes confirmed rows instead of keeping them for
	// OutboxRetention.
	DeleteOnDeliver bool
	// Notifier, when set, wakes the relay on other processes' commits.
	Notifier Notifier
	Logger   *slog.Logger
	// OnDelivered, when set, is called with each confirmed batch.
	OnDelivered func(msgs []*Message)

	once sync.Once
	mu   sync.Mutex
	gen  chan struct{} // closed and replaced on every wake
}

func (r *Relay) init() {
	r.once.Do(func() {
		if r.PollingInterval <= 0 {
			r.PollingInterval = DefaultPollingInterval
		}
		if r.BatchSize <= 0 {
			r.BatchSize = DefaultDispatchBatchSize
		}
		if r.Workers <= 0 {
			r.Workers = DefaultRelayWorkers
		}
		if r.Lease <= 0 {
			r.Lease = DefaultLease
		}
		if r.MaxAttempts <= 0 {
			r.MaxAttempts = DefaultMaxAttempts
		}
		if r.Logger == nil {
			r.Logger = slog.Default()
		}
		r.mu.Lock()
		r.gen = make(chan struct{})
		r.mu.Unlock()
	})
}

// Wake asks the relay to look for rows now. It never blocks. Call it after
// a transaction that wrote outbox rows commits (calling it earlier is
// harmless: the relay looks again shortly after).
func (r *Relay) Wake() {
	r.init()
	r.mu.Lock()
	close(r.gen)
	r.gen = make(chan struct{})
	r.mu.Unlock()
}

func (r *Relay) wakeChan() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

// Run relays until ctx is done.
func (r *Relay) Run(ctx context.Context) {
	r.init()
	var wg sync.WaitGroup
	if r.Notifier != nil {
		wg.Go(func() {
			b := backoff.NewExponentialBackOff()
			b.MaxInterval = 30 * time.Second
			for ctx.Err() == nil {
				err := r.Notifier.Listen(ctx, r.Wake)
				if ctx.Err() != nil {
					return
				}
				d := b.NextBackOff()
				r.Logger.WarnContext(ctx, "outbox: listening for commit notifications failed; polling meanwhile",
					"error", err, "retry_in", d)
				sleep(ctx, d)
			}
		})
	}
	for i := 0; i < r.Workers; i++ {
		wg.Go(func() { r.work(ctx) })
	}
	wg.Wait()
}

// afterEmptyWake are the re-checks after a wake-up that found nothing: the
// waking transaction may not have committed yet.
var afterEmptyWake = []time.Duration{2 * time.Millisecond, 10 * time.Millisecond, 40 * time.Millisecond, 150 * time.Millisecond}

func (r *Relay) work(ctx context.Context) {
	fail := backoff.NewExponentialBackOff()
	fail.InitialInterval = 100 * time.Millisecond
	fail.MaxInterval = 30 * time.Second
	recheck := len(afterEmptyWake)
	for ctx.Err() == nil {
		wake := r.wakeChan()
		n, err := r.DispatchOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := fail.NextBackOff()
			r.Logger.WarnContext(ctx, "outbox: relay pass failed; backing off", "error", err, "retry_in", d)
			sleep(ctx, d)
			continue
		}
		fail.Reset()
		if n > 0 {
			recheck = 0
			continue
		}
		var timer *time.Timer
		if recheck < len(afterEmptyWake) {
			timer = time.NewTimer(afterEmptyWake[recheck])
			recheck++
		} else {
			timer = time.NewTimer(r.idleWait(ctx))
		}
		select {
		case <-ctx.Done():
		case <-wake:
			recheck = 0
		case <-timer.C:
		}
		timer.Stop()
	}
}

// idleWait is how long an idle worker sleeps: until the earliest scheduled
// row is due, or PollingInterval if that comes first (or the store cannot
// tell). A wake-up or a clock advance ends the sleep sooner.
func (r *Relay) idleWait(ctx context.Context) time.Duration {
	d, ok, err := r.Store.NextDue(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.Logger.DebugContext(ctx, "outbox: next due time unknown; polling", "error", err)
		}
		return r.PollingInterval
	}
	if ok && d < r.PollingInterval {
		return d
	}
	return r.PollingInterval
}

// DispatchOnce claims one batch, delivers it and settles every row. It
// returns how many rows it claimed. A transport outage is returned as an
// error (after releasing the rows without counting an attempt).
func (r *Relay) DispatchOnce(ctx context.Context) (int, error) {
	r.init()
	batch, err := ClaimBatch(ctx, r.Store, r.Owner, r.BatchSize, r.Lease)
	if err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	msgs := batch.Messages()
	if len(msgs) == 0 {
		return 0, nil
	}
	errs := r.Transport.Deliver(WithRetryAfter(ctx), msgs)
	// Settle with a context that survives shutdown: confirmed rows must be
	// marked even when Stop arrives mid-batch.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if len(errs) != len(msgs) {
		// Nothing is known of any row: all go back, uncounted.
		err := fmt.Errorf("outbox: transport returned %d results for %d messages", len(errs), len(msgs))
		return len(msgs), errors.Join(err, batch.Settle(sctx, Settlement{}))
	}
	st := Settlement{Delete: r.DeleteOnDeliver}
	var down int
	var delivered []*Message
	for i, m := range msgs {
		var ra *RetryAfterError
		switch e := errs[i]; {
		case e == nil:
			st.Delivered = append(st.Delivered, m.ID)
			delivered = append(delivered, m)
		case errors.As(e, &ra) && ctx.Err() == nil:
			// Published, but the confirm is not trusted yet: the row stays
			// pending (not marked delivered: a crash now loses nothing)
			// and is sent again once the transport trusts its confirms.
			st.Later = append(st.Later, m.ID)
			st.LaterAfter = max(st.LaterAfter, ra.After)
		case errors.Is(e, ErrTransportUnavailable) || ctx.Err() != nil:
			// Not named in the settlement: back to pending, uncounted.
			down++
		default:
			parkAt := r.MaxAttempts
			if errors.Is(e, ErrUndeliverable) {
				parkAt = 1
			}
			r.Logger.WarnContext(ctx, "outbox: delivery failed", "message_id", m.MessageID, "outbox_id", m.ID,
				"message_type", m.MessageType, "destination", m.Destination,
				"attempt", m.Attempts+1, "max_attempts", parkAt, "error", e)
			st.Failed = append(st.Failed, FailedRow{ID: m.ID, Error: e.Error(), RetryAfter: retryDelay(m.Attempts + 1), MaxAttempts: parkAt})
		}
	}
	if len(st.Later) > 0 {
		r.Logger.DebugContext(ctx, "outbox: confirms not trusted yet; sending again later",
			"messages", len(st.Later), "retry_in", st.LaterAfter)
	}
	var settleErr error
	serr := batch.Settle(sctx, st)
	if serr != nil {
		// Rows not recorded are claimed again (a leased one after its
		// lease) and sent again: a duplicate the receiving inbox absorbs,
		// never a loss.
		settleErr = fmt.Errorf("settle: %w", serr)
	}
	if (serr == nil || errors.Is(serr, ErrDeliveredRecorded)) && len(delivered) > 0 && r.OnDelivered != nil {
		r.OnDelivered(delivered)
	}
	if down > 0 && ctx.Err() == nil {
		settleErr = errors.Join(settleErr, fmt.Errorf("%d of %d messages not delivered: %w", down, len(msgs), firstErr(errs)))
	}
	return len(msgs), settleErr
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// retryDelay is the wait before a failed row is tried again: 1s, 2s, 4s ...
// capped at 5 minutes.
func retryDelay(attempt int) time.Duration {
	d := time.Second
	for i := 1; i < attempt && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Cleaner deletes delivered rows older than Retention every Interval, in
// bounded batches; safe with several instances.
type Cleaner struct {
	Store     Store
	Retention time.Duration
	Interval  time.Duration
	Batch     int
	Logger    *slog.Logger
	// Clock, when set, times the interval (a test's fake clock): an
	// advance past the next pass runs it at once. Nil: the real clock.
	Clock Clock
}

// Clock is a controllable time source (tests only; see bus.WithClock).
type Clock interface {
	Now() time.Time
	// Advanced returns a channel closed when the clock next jumps forward.
	Advanced() <-chan struct{}
}

// Run cleans until ctx is done.
func (c *Cleaner) Run(ctx context.Context) {
	batchdel.Loop(ctx, c.Interval, c.Batch, c.del, c.Logger, "outbox cleanup", c.Clock)
}

// Once runs one pass and returns how many rows it deleted.
func (c *Cleaner) Once(ctx context.Context) (int, error) { return batchdel.Once(ctx, c.Batch, c.del) }

func (c *Cleaner) del(ctx context.Context, batch int) (int, error) {
	return c.Store.Cleanup(ctx, c.Retention, batch)
}
