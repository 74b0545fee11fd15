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

// Outcomes of a delivery (Event.Outcome of EventHandled).
const (
	OutcomeCommitted    = outcomeConsumed     // consumers succeeded, transaction committed
	OutcomeDuplicate    = outcomeDuplicate    // the inbox skipped it as already processed
	OutcomeDeadLettered = outcomeDeadLettered // moved to the dead-letter destination; Err says why
	OutcomeRedelivery   = outcomeRedelivery   // handed back for a delayed redelivery; Err says why
	OutcomeRequeued     = outcomeRequeued     // handed back to the broker (inbox busy, database down, shutdown)
	OutcomeAcked        = outcomeAcked        // acknowledged without running a consumer
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
	// InFlight counts deliveries being handled.
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
	bl := Backlog{InFlight: b.inFlight.Load(), Queued: -1}
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

func (t *telemetry) emit(ev Event) {
	if len(t.observers) == 0 {
		return
	}
	ev.Time = time.Now()
	for _, fn := range t.observers {
		fn(ev)
	}
}

// startEvents connects the embedded transport's settle signal; Start calls
// it (through startTelemetry).
func (b *Bus) startEvents() {
	if b.mem != nil && len(b.tel.observers) > 0 {
		b.mem.OnSettle(func() { b.tel.emit(Event{Kind: EventSettled}) })
	}
}

// emitHandled reports the end of a delivery's handling.
func (t *telemetry) emitHandled(ep, typ, id string, h map[string]string, body []byte, o *observation, outcome string) {
	if len(t.observers) == 0 {
		return
	}
	ev := Event{Kind: EventHandled, Endpoint: ep, MessageType: typ, MessageID: id, Outcome: outcome,
		Headers: maps.Clone(h), Body: body, Attempt: int(o.attempts.Load())}
	if p := o.lastErr.Load(); p != nil && outcome != OutcomeCommitted && outcome != OutcomeDuplicate {
		ev.Err = *p
	}
	if p := o.faultHeaders.Load(); p != nil && outcome == OutcomeDeadLettered {
		// The fault headers deadLetter wrote, bar the time.
		for k, v := range *p {
			if k != wire.HeaderFaultTime {
				ev.Headers[k] = v
			}
		}
	}
	t.emit(ev)
}

// emitPublished reports a message Publish/Send accepted.
func (t *telemetry) emitPublished(ctx context.Context, m *outbox.Message, viaOutbox, inTx bool) {
	if len(t.observers) == 0 {
		return
	}
	ev := Event{Kind: EventPublished, MessageType: m.MessageType, MessageID: m.MessageID, Destination: m.Destination,
		Headers: maps.Clone(m.Headers), Body: m.Payload, Outbox: viaOutbox, InTx: inTx}
	if o := observationFrom(ctx); o != nil {
		// attempts counts finished attempts: this is the next one.
		ev.ParentEndpoint, ev.ParentID, ev.ParentAttempt = o.endpoint, o.messageID, int(o.attempts.Load())+1
	}
	t.emit(ev)
}

func (t *telemetry) emitRelayed(msgs []*outbox.Message) {
	for _, m := range msgs {
		t.emit(Event{Kind: EventRelayed, MessageType: m.MessageType, MessageID: m.MessageID, Destination: m.Destination,
			Headers: maps.Clone(m.Headers), Body: m.Payload, Outbox: true})
	}
}

// emitCommitted reports messages the PostgreSQL transport wrote in
// transactions that have committed.
func (t *telemetry) emitCommitted(msgs []*outbox.Message) {
	for _, m := range msgs {
		t.emit(Event{Kind: EventRelayed, MessageType: m.MessageType, MessageID: m.MessageID, Destination: m.Destination,
			Headers: maps.Clone(m.Headers), Body: m.Payload})
	}
}
