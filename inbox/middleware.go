package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
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
	// BusyDelay caps how long a delivery that found the entry locked waits
	// before it is handed back to the broker, so that a requeue does not spin.
	// Defaults to 1s.
	BusyDelay time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnDuplicate, when set, is called for each duplicate skipped.
	OnDuplicate func(Key)
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
		run := func(txCtx context.Context) error {
			orig := msg.Context()
			msg.SetContext(txCtx)
			defer msg.SetContext(orig)
			_, err := h(msg)
			return err
		}

		if m.SingleTransaction {
			done, err := m.Store.ProcessAndLock(ctx, key, run)
			if err != nil {
				return nil, err
			}
			if !done {
				return nil, m.settleExisting(ctx, key, log, busyDelay)
			}
			return nil, nil
		}

		lock, err := m.Store.TryLock(ctx, key, m.LockTimeout)
		if err != nil {
			return nil, fmt.Errorf("inbox: lock %s/%s: %w", key.MessageID, key.ConsumerType, err)
		}
		switch lock.State {
		case Processed:
			m.duplicate(ctx, key, log)
			return nil, nil
		case Busy:
			return nil, m.busy(ctx, lock.ExpiresAt, busyDelay)
		}
		err = m.Store.Process(ctx, key, lock.Token, run)
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, ErrLockLost) {
			// Release at once so the retry (or redelivery) can lock again;
			// if this fails too, the lock simply expires.
			if rerr := m.Store.Release(context.WithoutCancel(ctx), key, lock.Token); rerr != nil {
				log.WarnContext(ctx, "inbox: releasing lock failed; it will expire",
					"message_id", key.MessageID, "consumer_type", key.ConsumerType, "error", rerr)
			}
		}
		return nil, err
	}
}

// settleExisting decides, for the single-transaction mode, whether an
// existing entry is a duplicate (ack) or an in-progress delivery (requeue).
func (m *Middleware) settleExisting(ctx context.Context, key Key, log *slog.Logger, busyDelay time.Duration) error {
	entries, err := m.Store.List(ctx, Query{MessageID: key.MessageID, ConsumerType: key.ConsumerType, Limit: 1})
	if err != nil {
		return fmt.Errorf("inbox: read entry %s/%s: %w", key.MessageID, key.ConsumerType, err)
	}
	if len(entries) == 1 && entries[0].ProcessedAt == nil {
		return m.busy(ctx, entries[0].ExpiresAt, busyDelay)
	}
	m.duplicate(ctx, key, log)
	return nil
}

func (m *Middleware) duplicate(ctx context.Context, key Key, log *slog.Logger) {
	log.DebugContext(ctx, "inbox: duplicate skipped", "message_id", key.MessageID, "consumer_type", key.ConsumerType)
	if m.OnDuplicate != nil {
		m.OnDuplicate(key)
	}
}

// busy waits until the other delivery's lock should be settled (bounded by
// busyDelay) and returns ErrBusy so the message is requeued, not lost.
func (m *Middleware) busy(ctx context.Context, expiresAt time.Time, busyDelay time.Duration) error {
	wait := time.Until(expiresAt)
	if wait > busyDelay || wait <= 0 {
		wait = busyDelay
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return ErrBusy
}
