package bus

import (
	"context"
	"maps"
	"time"

	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
)

// EventKind says what an Event reports.
type EventKind int

// Kinds of events.
const (
	// EventHandled: a delivery's handling ended; Outcome says how.
	EventHandled EventKind = iota + 1
	// EventRetried: an attempt failed and is retried in process; Err is
	// the attempt's error.
	EventRetried
	// EventPublished: Publish, Send or their Tx twins accepted a message:
	// confirmed by the transport (Outbox false), or written to the outbox
	// in a transaction that has not necessarily committed yet (Outbox true;
	// Parent names the delivery whose transaction it is, if any).
	EventPublished
	// EventRelayed: the relay had an outbox row confirmed by the transport,
	// or (Outbox false) the PostgreSQL transport saw the transaction that
	// wrote the message commit.
	EventRelayed
	// EventSettled: the embedded transport settled a delivery (acked or
	// handed back) or released a delayed one; Backlog may have dropped.
	EventSettled
)

// Outcomes of a delivery (Event.Outcome of EventHandled, and the outcome
// attribute of the barewire.handler.duration metric).
const (
	OutcomeCommitted    = "consumed"             // consumers succeeded, transaction committed
	OutcomeDuplicate    = "duplicate"            // the inbox skipped it as already processed
	OutcomeDeadLettered = "dead_lettered"        // moved to the dead-letter destination; Err says why
	OutcomeRedelivery   = "redelivery_scheduled" // handed back for a delayed redelivery; Err says why
	OutcomeRequeued     = "requeued"             // handed back to the broker (inbox busy, database down, shutdown)
	OutcomeAcked        = "acked"                // acknowledged without running a consumer
)

// Event is one thing the bus did, for an observer (WithObserver).
type Event struct {
	Kind        EventKind
	Time        time.Time
	Endpoint    string // the receiving endpoint (EventHandled, EventRetried)
	MessageType string
	MessageID   string
	// Destination is where a published or relayed message goes
	// ("exchange:<type>", "queue:<name>").
	Destination string
	// Outcome of EventHandled: one of the Outcome* constants.
	Outcome string
	// Err is the consumer's error (retried, dead-lettered, redelivery).
	Err error
	// Attempt is the in-process attempt that ended (EventHandled, EventRetried).
	Attempt int
	// Headers are the message's headers as received (EventHandled,
	// EventRetried) or as published; for a dead letter they include the
	// fault headers the bus writes (HeaderFault*, but HeaderFaultTime).
	Headers map[string]string
	Body    []byte
	// Outbox says a published message went to the outbox, not straight to
	// the transport; InTx that it was written in a transaction (an outbox
	// row, or the PostgreSQL transport's table) that may still roll back.
	Outbox, InTx bool
	// ParentEndpoint, ParentID and ParentAttempt name the delivery (and
	// its in-process attempt) in whose transaction a consumer published.
	ParentEndpoint, ParentID string
	ParentAttempt            int
}

// WithObserver calls fn with every Event, synchronously on the goroutine
// that did the work: fn must be quick and must not call back into the
// bus. Package bustest is built on it. Defaults to none.
func WithObserver(fn func(Event)) Option {
	return func(c *config) error {
		if fn == nil {
			return optErr("WithObserver: function is nil")
		}
		c.telemetry.observers = append(c.telemetry.observers, fn)
		return nil
	}
}

// Backlog is what the bus still has to do.
type Backlog struct {
	// InFlight counts deliveries held: being handled or, with group
	// commit, waiting for a worker.
	InFlight int64
	// Queued counts messages the embedded transport holds for its
	// endpoints (queued or unacknowledged); -1 on a broker, whose queues
	// the bus does not count. A delayed redelivery is an outbox row.
	Queued int
	// OutboxPending counts outbox rows the relay has not delivered
	// (parked rows excluded).
	OutboxPending int64
}

// Idle reports whether nothing is left to do.
func (b Backlog) Idle() bool { return b.InFlight == 0 && b.Queued <= 0 && b.OutboxPending == 0 }

// Backlog returns what the bus still has to do, counting the outbox afresh.
func (b *Bus) Backlog(ctx context.Context) (Backlog, error) {
	if b.outboxSt == nil {
		return Backlog{}, ErrNotStarted
	}
	bl := Backlog{InFlight: b.ctr.inFlight.Load(), Queued: -1}
	if b.mem != nil {
		bl.Queued = b.mem.Outstanding()
	}
	st, err := b.outboxSt.Stats(ctx)
	if err != nil {
		return bl, err
	}
	bl.OutboxPending = st.Pending
	return bl, nil
}

// eventObserver hands the WithObserver functions their Events.
type eventObserver struct {
	nopObserver
	fns []func(Event)
}

func (o eventObserver) emit(ev Event) {
	ev.Time = time.Now()
	for _, fn := range o.fns {
		fn(ev)
	}
}

func (o eventObserver) retried(_ context.Context, d *delivery) {
	o.emit(Event{Kind: EventRetried, Endpoint: d.endpoint, MessageID: d.msg.UUID, MessageType: d.messageType,
		Attempt: int(d.attempt.Load()), Err: d.lastErr})
}

func (o eventObserver) handled(_ context.Context, d *delivery) {
	ev := Event{Kind: EventHandled, Endpoint: d.endpoint, MessageType: d.messageType, MessageID: d.msg.UUID, Outcome: d.outcome,
		Headers: maps.Clone(d.msg.Metadata), Body: d.msg.Payload, Attempt: int(d.attempt.Load())}
	if d.outcome != OutcomeCommitted && d.outcome != OutcomeDuplicate {
		ev.Err = d.lastErr
	}
	if d.outcome == OutcomeDeadLettered {
		for k, v := range d.faultHeaders {
			if k != wire.HeaderFaultTime {
				ev.Headers[k] = v
			}
		}
	}
	o.emit(ev)
}

func (o eventObserver) published(ctx context.Context, m *outbox.Message, viaOutbox, inTx bool) {
	ev := Event{Kind: EventPublished, MessageType: m.MessageType, MessageID: m.MessageID, Destination: m.Destination,
		Headers: maps.Clone(m.Headers), Body: m.Payload, Outbox: viaOutbox, InTx: inTx}
	if d := deliveryFrom(ctx); d != nil {
		ev.ParentEndpoint, ev.ParentID, ev.ParentAttempt = d.endpoint, d.msg.UUID, int(d.attempt.Load())
	}
	o.emit(ev)
}

func (o eventObserver) delivered(msgs []*outbox.Message, viaOutbox bool) {
	for _, m := range msgs {
		o.emit(Event{Kind: EventRelayed, MessageType: m.MessageType, MessageID: m.MessageID, Destination: m.Destination,
			Headers: maps.Clone(m.Headers), Body: m.Payload, Outbox: viaOutbox})
	}
}

func (o eventObserver) settled() { o.emit(Event{Kind: EventSettled}) }
