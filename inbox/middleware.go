package inbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/internal/detach"
)

// Middleware deduplicates deliveries for one consumer type with the
// two-phase algorithm (or the single-transaction variant): a message whose
// inbox entry is processed is acked without running the handler; a message
// locked by another delivery goes back to the broker; otherwise the handler
// runs in one transaction with the processed mark.
//
// msg.UUID must be the message id; the caller handles messages without one.
type Middleware struct {
	Store Store
	// ConsumerType is the second half of the inbox key (the endpoint name).
	ConsumerType string
	// LockTimeout is InboxLockTimeout. Required.
	LockTimeout time.Duration
	// SingleTransaction takes the lock inside the processing transaction.
	SingleTransaction bool
	// BusyDelay is how often a delivery that found the entry locked by
	// another checks it again. Defaults to 1s.
	BusyDelay time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnDuplicate, when set, is called for each duplicate skipped, with
	// the context of the delivery skipped.
	OnDuplicate func(context.Context, Key)
	// OnLockKept, when set, is called with the token of a lock that a
	// failed attempt could not release (the database failed under it),
	// with the attempt's context: the caller's next attempt of the same
	// delivery can release it first instead of waiting for it to expire.
	OnLockKept func(ctx context.Context, key Key, token string)
	// Stopping, when set, ends the wait for another delivery's lock with
	// ErrBusy when it is closed (the bus is stopping): the message goes
	// back to the broker instead of holding Stop until the lock expires.
	Stopping <-chan struct{}
	// Settled, when set, is shared by the deliveries of one consumer type
	// in this process: a delivery waiting for another's lock wakes as soon
	// as that one's attempt ends, instead of at the next BusyDelay.
	Settled *Settled
	// Clock, when set, is the clock the store decides lock expiry by (a
	// test's fake clock): the wait for another delivery's lock measures
	// against it and ends early when it advances. Nil: the real clock.
	Clock Clock
}

// Middleware returns the Watermill handler middleware.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	log := m.Logger
	if log == nil {
		log = slog.Default()
	}
	busyDelay := m.BusyDelay
	if busyDelay <= 0 {
		busyDelay = time.Second
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		key := Key{MessageID: msg.UUID, ConsumerType: m.ConsumerType}
		if key.MessageID == "" {
			return nil, errors.New("inbox: message has no id; apply the endpoint's missing-id policy before the inbox")
		}
		var handlerErr error
		ran := false
		run := func(txCtx context.Context) error {
			orig := msg.Context()
			msg.SetContext(txCtx)
			defer msg.SetContext(orig)
			ran = true
			_, handlerErr = h(msg)
			return handlerErr
		}
		// storeErr classifies what Process returned: the handler's own
		// error, a lost lock, or a failure of the database work around it.
		storeErr := func(op string, err error) error {
			if err == nil || errors.Is(err, ErrLockLost) || (ran && handlerErr != nil && errors.Is(err, handlerErr)) {
				return err
			}
			return &StoreError{Op: op, Err: err}
		}

		// A delivery that finds the entry locked by another waits here for
		// that delivery to finish (a duplicate, then) or for its lock to
		// expire (a crashed delivery, taken over). Waiting in process rather
		// than requeueing spares the broker a requeue per second, which
		// quorum queues count towards their delivery limit.
		w := busyWatch{m: m, key: key}
		defer w.end()
		if m.SingleTransaction {
			for {
				ran, handlerErr = false, nil
				done, err := m.Store.ProcessAndLock(ctx, key, run)
				if ran {
					m.Settled.Settle(key)
				}
				if err != nil {
					return nil, storeErr("process", err)
				}
				if done {
					return nil, nil
				}
				busy, expiresAt, err := m.existing(ctx, key, log)
				if err != nil || !busy {
					return nil, err
				}
				if err := w.wait(ctx, expiresAt, busyDelay); err != nil {
					return nil, err
				}
			}
		}

		lp, pipelined := m.Store.(LockProcessor)
		var lock Lock
		var err error
		for {
			if pipelined {
				lock, err = lp.LockAndProcess(ctx, key, m.LockTimeout, run)
				if err != nil && lock.State == 0 {
					return nil, &StoreError{Op: "lock " + key.MessageID + "/" + key.ConsumerType, Err: err}
				}
			} else {
				lock, err = m.Store.TryLock(ctx, key, m.LockTimeout)
				if err != nil {
					return nil, &StoreError{Op: "lock " + key.MessageID + "/" + key.ConsumerType, Err: err}
				}
			}
			if lock.State == Processed {
				m.duplicate(ctx, key, log)
				return nil, nil
			}
			if lock.State == Acquired {
				break
			}
			if err := w.wait(ctx, lock.ExpiresAt, busyDelay); err != nil {
				return nil, err
			}
		}
		w.end()
		// Whatever the attempt's end, deliveries of this process waiting
		// for the entry look again at once.
		defer m.Settled.Settle(key)
		if !pipelined {
			err = m.Store.Process(ctx, key, lock.Token, run)
		}
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, ErrLockLost) {
			// Release at once so the retry (or redelivery) can lock again;
			// if this fails too, the lock simply expires.
			rctx, cancel := detach.From(ctx)
			rerr := m.Store.Release(rctx, key, lock.Token)
			cancel()
			if errors.Is(rerr, ErrLockLost) {
				// Another delivery took the entry over while this attempt
				// ran (its lock expired: a frozen or slow attempt): this
				// failure is not the message's. The caller looks again and
				// finds the entry processed, or takes it.
				log.DebugContext(ctx, "inbox: a failed attempt's lock had been taken over; not counted",
					"message_id", key.MessageID, "consumer_type", key.ConsumerType, "error", err)
				return nil, ErrLockLost
			}
			if rerr != nil {
				if m.OnLockKept != nil {
					m.OnLockKept(ctx, key, lock.Token)
				}
				log.WarnContext(ctx, "inbox: releasing lock failed; the next attempt releases it, or it expires",
					"message_id", key.MessageID, "consumer_type", key.ConsumerType, "error", rerr)
			}
		}
		return nil, storeErr("process", err)
	}
}

// existing reads, for the single-transaction mode, the entry that kept
// ProcessAndLock from inserting: an in-progress delivery (busy, until
// expiresAt) or a duplicate (acked here; not busy).
func (m *Middleware) existing(ctx context.Context, key Key, log *slog.Logger) (busy bool, expiresAt time.Time, err error) {
	entries, err := m.Store.List(ctx, Query{MessageID: key.MessageID, ConsumerType: key.ConsumerType, Limit: 1})
	if err != nil {
		return false, time.Time{}, &StoreError{Op: "read entry " + key.MessageID + "/" + key.ConsumerType, Err: err}
	}
	if len(entries) == 1 && entries[0].ProcessedAt == nil {
		return true, entries[0].ExpiresAt, nil
	}
	m.duplicate(ctx, key, log)
	return false, time.Time{}, nil
}

func (m *Middleware) duplicate(ctx context.Context, key Key, log *slog.Logger) {
	log.DebugContext(ctx, "inbox: duplicate skipped", "message_id", key.MessageID, "consumer_type", key.ConsumerType)
	if m.OnDuplicate != nil {
		m.OnDuplicate(ctx, key)
	}
}

// busyWatch is one delivery's watch (Settled) on an entry it found busy.
// Nothing is watched until the entry is first found busy, so a delivery
// that takes the lock at once costs nothing; then the watch is taken and
// the entry looked at once more before any wait, so that a holder ending
// between the read and the watch is not missed.
type busyWatch struct {
	m    *Middleware
	key  Key
	ch   <-chan struct{}
	stop func()
}

// wait is called each time the entry is found busy. The first time (with
// Settled) it only takes the watch and returns: the caller looks again.
// Otherwise it waits (Middleware.wait); a watch that fired is spent, and
// the next busy finding takes a new one.
func (w *busyWatch) wait(ctx context.Context, expiresAt time.Time, busyDelay time.Duration) error {
	if w.m.Settled != nil && w.stop == nil {
		w.ch, w.stop = w.m.Settled.Watch(w.key)
		return nil
	}
	err := w.m.wait(ctx, expiresAt, busyDelay, w.ch)
	select {
	case <-w.ch: // nil without Settled: never ready
		w.end()
	default:
	}
	return err
}

// end ends the watch, if one is taken.
func (w *busyWatch) end() {
	if w.stop != nil {
		w.stop()
		w.ch, w.stop = nil, nil
	}
}

// wait sleeps until the other delivery's lock should be settled, at most
// busyDelay, or until settled closes (the holder, in this process, ended
// its attempt), and returns ErrBusy if ctx ends or Stopping closes first
// (the message is then requeued, not lost).
func (m *Middleware) wait(ctx context.Context, expiresAt time.Time, busyDelay time.Duration, settled <-chan struct{}) error {
	now, advanced := time.Now, (<-chan struct{})(nil)
	if m.Clock != nil {
		// The channel first: an advance between the two calls still wakes us.
		advanced = m.Clock.Advanced()
		now = m.Clock.Now
	}
	wait := expiresAt.Sub(now()) + 10*time.Millisecond
	if wait > busyDelay || wait <= 0 {
		wait = busyDelay
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ErrBusy
	case <-m.Stopping: // nil when not set: never ready
		return ErrBusy
	case <-t.C:
		return nil
	case <-settled: // nil without Settled: never ready
		return nil
	case <-advanced:
		return nil
	}
}

// Clock is a controllable time source (tests only; see bus.WithClock).
type Clock interface {
	Now() time.Time
	// Advanced returns a channel closed when the clock next jumps forward.
	Advanced() <-chan struct{}
}
