package bus

import (
	"context"
	"fmt"
	"maps"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/wire"
)

// Schedule headers. Publish, Send and their Tx twins read them and remove
// them from the message: the consumer never sees them. Delay and DeliverAt
// write them; set them by hand only to pass a schedule through code that
// deals in Headers (a string form: a Go duration such as "90s", an RFC 3339
// time).
const (
	// HeaderDelay holds a message back for a duration (time.ParseDuration
	// form) after the publish, by the database's clock.
	HeaderDelay = "BW-Delay"
	// HeaderDeliverAt holds a message back until a time (RFC 3339, with
	// fractional seconds if wanted).
	HeaderDeliverAt = "BW-DeliverAt"
)

// MaxScheduleDelay is the furthest into the future a message may be
// scheduled. Anything beyond is refused as a mistake (a Unix time read as
// a duration, say) rather than kept in the outbox for centuries.
const MaxScheduleDelay = 10 * 365 * 24 * time.Hour

// Delay returns headers that schedule a publish or send d from now, merged
// with any more headers given (later ones win; a schedule header among them
// overrides d). A scheduled message always goes through the outbox: in the
// caller's transaction (PublishTx, SendTx, or inside a consumer) or in a
// transaction of its own, whatever PublishThroughOutbox says and whatever
// the transport, so it is durable and can be cancelled until it leaves (see
// CancelScheduled). It becomes due d after the insert by the database's
// clock and leaves with the relay's next wake-up (docs/scheduling.md says
// how precise that is). d ≤ 0 means due at once, still through the outbox;
// d above MaxScheduleDelay is refused with ErrInvalidMessage.
//
// To cancel it later, give the message an id of your own:
//
//	id := bus.NewMessageID()
//	err := b.Publish(ctx, msg, bus.Delay(time.Hour, bus.Headers{bus.HeaderMessageID: id}))
//	...
//	cancelled, err := b.CancelScheduled(ctx, id)
func Delay(d time.Duration, more ...Headers) Headers {
	return merge(Headers{HeaderDelay: d.String()}, more)
}

// DeliverAt returns headers that schedule a publish or send for t, merged
// with any more headers given, as Delay does. The wait is t minus the
// bus's clock at the publish, counted from the insert by the database's
// clock, so a skew between the service's clock and the database's does not
// move it. A t in the past means due at once; the zero time, or one more
// than MaxScheduleDelay ahead, is refused with ErrInvalidMessage.
func DeliverAt(t time.Time, more ...Headers) Headers {
	v := ""
	if !t.IsZero() {
		v = t.UTC().Format(time.RFC3339Nano)
	}
	return merge(Headers{HeaderDeliverAt: v}, more)
}

func merge(h Headers, more []Headers) Headers {
	for _, m := range more {
		maps.Copy(h, m)
	}
	return h
}

// NewMessageID returns a new message id of the kind the bus makes for a
// message published without one (a UUID). Use it to know a scheduled
// message's id in advance, for CancelScheduled.
func NewMessageID() string { return wire.NewID() }

// takeSchedule removes the schedule headers from h and returns the wait
// they ask for. scheduled is false when h has none.
func (b *Bus) takeSchedule(h Headers) (delay time.Duration, scheduled bool, err error) {
	dv, hasDelay := h[HeaderDelay]
	av, hasAt := h[HeaderDeliverAt]
	delete(h, HeaderDelay)
	delete(h, HeaderDeliverAt)
	switch {
	case !hasDelay && !hasAt:
		return 0, false, nil
	case hasDelay && hasAt:
		return 0, false, fmt.Errorf("%w: both %s and %s are set; schedule with one of bus.Delay or bus.DeliverAt", ErrInvalidMessage, HeaderDelay, HeaderDeliverAt)
	case hasDelay:
		delay, err = time.ParseDuration(dv)
		if err != nil {
			return 0, false, fmt.Errorf("%w: %s %q is not a duration such as \"90s\": %w", ErrInvalidMessage, HeaderDelay, dv, err)
		}
	default:
		if av == "" {
			return 0, false, fmt.Errorf("%w: %s is the zero time; pass the time the message is due to bus.DeliverAt", ErrInvalidMessage, HeaderDeliverAt)
		}
		at, err := time.Parse(time.RFC3339Nano, av)
		if err != nil {
			return 0, false, fmt.Errorf("%w: %s %q is not an RFC 3339 time: %w", ErrInvalidMessage, HeaderDeliverAt, av, err)
		}
		delay = at.Sub(b.now())
	}
	if delay > MaxScheduleDelay {
		return 0, false, fmt.Errorf("%w: scheduled %v ahead, beyond MaxScheduleDelay (%v); is the duration or time a mistake?", ErrInvalidMessage, delay, MaxScheduleDelay)
	}
	return max(delay, 0), true, nil
}

func (b *Bus) now() time.Time {
	if b.cfg.clock != nil {
		return b.cfg.clock.Now()
	}
	return time.Now()
}

// CancelScheduled cancels the message with messageID if it cannot have
// left the outbox: true means it never will. It deletes the message's
// outbox rows that are pending and not yet due, never failed, never sent
// and held by no relay; a due row may already be on its way (a relay may
// have published it and failed to record that), so it is left alone.
// Inside a consumer (ctx carries its transaction) the cancel happens in
// that transaction and takes effect only if the consumer's work commits;
// elsewhere in a statement of its own.
//
// false with a nil error means the message may have left or be leaving
// now, was cancelled before, or never existed. Although it is meant for
// scheduled messages, it cancels any outbox row with that id that meets
// the rule (a delayed redelivery waiting for its time too).
func (b *Bus) CancelScheduled(ctx context.Context, messageID string) (bool, error) {
	return b.cancelScheduled(ctx, nil, messageID)
}

// CancelScheduledTx cancels the message with messageID in tx, as
// CancelScheduled does: if tx commits, the message never leaves; if it
// rolls back, the message stays scheduled. CancelScheduledTx does not
// commit tx.
func (b *Bus) CancelScheduledTx(ctx context.Context, tx *gorm.DB, messageID string) (bool, error) {
	if tx == nil {
		return false, fmt.Errorf("%w: CancelScheduledTx: tx is nil", ErrInvalidMessage)
	}
	return b.cancelScheduled(ctx, tx, messageID)
}

func (b *Bus) cancelScheduled(ctx context.Context, tx *gorm.DB, messageID string) (bool, error) {
	if messageID == "" {
		return false, fmt.Errorf("%w: CancelScheduled: empty message id", ErrInvalidMessage)
	}
	if b.outboxSt == nil {
		return false, ErrNotStarted
	}
	if tx != nil {
		ctx = gormstore.WithTx(ctx, tx)
	}
	n, err := b.outboxSt.Cancel(ctx, messageID)
	if err != nil {
		return false, fmt.Errorf("bus: cancel scheduled message %s: %w", messageID, err)
	}
	return n > 0, nil
}

// CancelScheduled cancels a scheduled message from inside a consumer
// (endpoint.Delivery.CancelScheduled): in the consumer's transaction, so
// the cancel commits or rolls back with the consumer's work.
func (p consumerPublisher) CancelScheduled(ctx context.Context, messageID string) (bool, error) {
	if tx, ok := gormstore.TxFromContext(ctx); ok {
		return p.b.CancelScheduledTx(ctx, tx, messageID)
	}
	return p.b.CancelScheduled(ctx, messageID)
}
