package bus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// Raw is a message whose body is already serialized. Publish, Send and
// their Tx twins send its Body as it is.
type Raw struct {
	// Type is the message type (BW-MessageType); required for Publish.
	Type        string
	ContentType string // Defaults to application/octet-stream.
	Body        []byte
}

// TxFromContext returns the GORM transaction a consumer runs in (the one the
// inbox marks in and the outbox writes to), or nil when ctx carries none.
// Do every database write of a consumer through it: with the embedded
// SQLite default, the transaction holds the only connection.
func TxFromContext(ctx context.Context) *gorm.DB {
	tx, ok := gormstore.TxFromContext(ctx)
	if !ok {
		return nil
	}
	return tx.WithContext(ctx)
}

// Publish publishes msg to every endpoint that consumes its type. Inside a
// consumer (ctx carries its transaction) the message goes to the outbox in
// that transaction and is sent only if it commits. Elsewhere it goes
// straight to the transport and Publish returns once the broker confirmed it
// (or, with PublishThroughOutbox, once its own outbox transaction committed).
//
// Headers: "message-id" preserves a caller-chosen id (a new one is made
// otherwise), "correlation-id" sets the correlation id, "BW-MessageType"
// overrides the type name, "BW-Exchange" the exchange.
func (b *Bus) Publish(ctx context.Context, msg any, headers Headers) error {
	return b.route(ctx, nil, "", msg, headers)
}

// PublishTx writes msg to the outbox in tx. If tx commits, the message is
// delivered at least once, with its message-id preserved so that receivers'
// inboxes absorb repeats; if tx rolls back, it is never sent. PublishTx does
// not commit tx. In a Transaction on PostgreSQL with postgresdb.Pipeline the
// row is written at commit, with the COMMIT (see Transaction); PublishTx
// still returns at once what is wrong with the message.
func (b *Bus) PublishTx(ctx context.Context, tx *gorm.DB, msg any, headers Headers) error {
	if tx == nil {
		return fmt.Errorf("%w: PublishTx: tx is nil", ErrInvalidMessage)
	}
	return b.route(ctx, tx, "", msg, headers)
}

// Send sends msg to one destination: a receive endpoint's name, "queue:name"
// or "exchange:name". It is transactional inside a consumer, like Publish.
func (b *Bus) Send(ctx context.Context, destination string, msg any, headers Headers) error {
	if destination == "" {
		return fmt.Errorf("%w: Send: empty destination", ErrInvalidMessage)
	}
	return b.route(ctx, nil, destination, msg, headers)
}

// SendTx writes msg for destination to the outbox in tx; commit and rollback
// mean what they mean for PublishTx.
func (b *Bus) SendTx(ctx context.Context, tx *gorm.DB, destination string, msg any, headers Headers) error {
	if tx == nil {
		return fmt.Errorf("%w: SendTx: tx is nil", ErrInvalidMessage)
	}
	if destination == "" {
		return fmt.Errorf("%w: SendTx: empty destination", ErrInvalidMessage)
	}
	return b.route(ctx, tx, destination, msg, headers)
}

// Transaction runs fn in a transaction on the bus's database and wakes the
// relay as soon as it commits, so that what fn published leaves at once.
// fn's error, or a panic, rolls the transaction back.
//
// On PostgreSQL with the postgresdb.Pipeline plugin registered on the
// database (postgresdb.Open does), what PublishTx and SendTx write in tx
// waits for the commit and goes in one multi-row insert sent together with
// the COMMIT: BEGIN, fn's statements and one round trip, however many
// messages fn publishes. PublishTx still returns what is wrong with a
// message at once; a failed outbox insert fails the commit and rolls the
// transaction back. After a SAVEPOINT in tx (a nested tx.Transaction, say)
// messages are written at once again, so that a ROLLBACK TO removes them
// with the rest. Elsewhere, and for a transaction of your own passed to
// PublishTx, the outbox row is written by PublishTx itself.
func (b *Bus) Transaction(ctx context.Context, fn func(tx *gorm.DB) error) error {
	if b.db == nil {
		return ErrNotStarted
	}
	err := b.runTx(ctx, fn)
	if err == nil {
		b.wake()
	}
	return err
}

// runTx runs fn in a transaction on the bus's database and commits it, or
// rolls it back when fn fails or panics: on PostgreSQL with the
// postgresdb.Pipeline plugin a transaction of Outbox.Begin (its BEGIN sent
// with fn's first statement, the outbox rows fn published with the
// COMMIT), elsewhere GORM's. Transaction and the consumers without the
// inbox (inTx) run on it.
func (b *Bus) runTx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	if b.store != nil {
		tx, err := b.store.Outbox().Begin(ctx, b.db)
		if err != nil {
			return fmt.Errorf("bus: begin transaction: %w", err)
		}
		if tx != nil {
			return runDeferred(ctx, tx, fn)
		}
	}
	return b.db.WithContext(ctx).Transaction(fn)
}

// runDeferred runs fn in tx, a transaction of gormstore's Outbox.Begin, and
// commits it, or rolls it back when fn fails or panics.
func runDeferred(ctx context.Context, tx *gorm.DB, fn func(tx *gorm.DB) error) (err error) {
	d := gormstore.DeferredOf(tx)
	panicked := true
	defer func() {
		if panicked || err != nil {
			_ = d.Rollback() // ErrTxDone after a failed commit, which rolled back
		}
	}()
	err = fn(tx)
	panicked = false
	if err != nil {
		return err
	}
	return d.CommitContext(ctx)
}

// WakeRelay makes the outbox relay look for pending rows now rather than at
// its next poll, for code that makes rows pending outside Publish and
// Transaction (re-queuing parked rows through OutboxStore, say). It does
// nothing while the relay is not running.
func (b *Bus) WakeRelay() { b.wake() }

func (b *Bus) wake() {
	// No lock: consumers call this while Stop drains them.
	if r := b.wakeRelay.Load(); r != nil {
		r.Wake()
	}
}

func (b *Bus) route(ctx context.Context, tx *gorm.DB, destination string, msg any, headers Headers) (err error) {
	m, scheduled, err := b.envelope(destination, msg, headers)
	if err != nil {
		return err
	}
	if tx == nil {
		if ctxTx, ok := gormstore.TxFromContext(ctx); ok {
			tx = ctxTx
			if st := stateFrom(ctx); st != nil {
				st.published.Store(true)
			}
		}
	}
	// A scheduled message always waits in the outbox: that is where it is
	// durable and cancellable, whatever the transport.
	viaOutbox := tx != nil || scheduled || b.cfg.outboxOpts.PublishThroughOutbox
	ctx, endSpan := b.tel.startPublish(ctx, m, viaOutbox) // the span; trace context into m.Headers
	direct := false
	defer func() {
		endSpan(err, direct)
		if err == nil {
			b.obs.published(ctx, m, viaOutbox && !direct, viaOutbox)
		}
	}()
	if tx != nil {
		// A transport that writes in the caller's transaction (PostgreSQL
		// on the same database) needs no outbox row and no relay hop,
		// unless the message must wait for its time.
		if done, err := b.deliverInTx(ctx, tx, m, scheduled); done {
			direct = true
			if err != nil {
				return fmt.Errorf("bus: publish in transaction: %w", err)
			}
			return nil
		}
		if b.outboxSt == nil {
			return ErrNotStarted
		}
		if err := b.outboxSt.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{m}); err != nil {
			return fmt.Errorf("bus: write outbox: %w", err)
		}
		if gormstore.DeferredOf(tx) == nil {
			b.wake()
		} // else Transaction wakes the relay once the row is committed
		return nil
	}
	if err := b.running(); err != nil {
		return err
	}
	if b.cfg.outboxOpts.PublishThroughOutbox || scheduled {
		return b.Transaction(ctx, func(tx *gorm.DB) error {
			return b.outboxSt.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{m})
		})
	}
	if err := b.tr.Deliver(ctx, []*outbox.Message{m})[0]; err != nil {
		return fmt.Errorf("bus: publish %s %s: %w", m.MessageType, m.MessageID, err)
	}
	return nil
}

// envelope serializes msg and resolves its id, type, destination and
// schedule (scheduled: the headers asked for Delay or DeliverAt).
func (b *Bus) envelope(destination string, msg any, headers Headers) (m *outbox.Message, scheduled bool, err error) {
	h := maps.Clone(headers)
	if h == nil {
		h = Headers{}
	}
	delay, scheduled, err := b.takeSchedule(h)
	if err != nil {
		return nil, false, err
	}
	m, err = b.envelopeOf(destination, msg, h)
	if err != nil {
		return nil, false, err
	}
	m.Delay = delay
	return m, scheduled, nil
}

// envelopeOf serializes msg and resolves its id, type and destination.
func (b *Bus) envelopeOf(destination string, msg any, headers Headers) (*outbox.Message, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: message is nil", ErrInvalidMessage)
	}
	h := maps.Clone(headers)
	if h == nil {
		h = Headers{}
	}
	take := func(k string) string {
		v := h[k]
		delete(h, k)
		return v
	}
	m := &outbox.Message{
		MessageID:     take(wire.HeaderMessageID),
		CorrelationID: take(wire.HeaderCorrelationID),
		MessageType:   take(wire.HeaderMessageType),
		ContentType:   take(wire.HeaderContentType),
		RoutingKey:    take(wire.HeaderRoutingKey),
	}
	exchange := take(wire.HeaderExchange)
	delete(h, wire.HeaderDestination)
	if m.MessageID == "" {
		m.MessageID = wire.NewID()
	}
	switch v := msg.(type) {
	case Raw:
		m.Payload = v.Body
		if m.MessageType == "" {
			m.MessageType = v.Type
		}
		if m.ContentType == "" {
			m.ContentType = v.ContentType
		}
		if m.ContentType == "" {
			m.ContentType = "application/octet-stream"
		}
	case *Raw:
		return b.envelopeOf(destination, *v, headers)
	default:
		body, err := b.cfg.serializer.Marshal(msg)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
		}
		m.Payload = body
		if m.MessageType == "" {
			m.MessageType = endpoint.TypeName(msg)
		}
		if m.ContentType == "" {
			m.ContentType = b.cfg.serializer.ContentType()
		}
	}
	if len(m.Payload) > b.cfg.maxMessageSize {
		return nil, fmt.Errorf("%w: %d bytes exceed the limit of %d (WithMaxMessageSize)", ErrMessageTooLarge, len(m.Payload), b.cfg.maxMessageSize)
	}
	switch {
	case destination != "":
		kind, name := wire.ParseDestination(destination)
		if name == "" {
			return nil, fmt.Errorf("%w: destination %q has no name", ErrInvalidMessage, destination)
		}
		m.Destination = kind + ":" + name
	case exchange != "":
		m.Destination = wire.ExchangePrefix + exchange
	default:
		if m.MessageType == "" {
			return nil, fmt.Errorf("%w: cannot publish a message without a type; set Raw.Type or the %s header", ErrInvalidMessage, wire.HeaderMessageType)
		}
		m.Destination = wire.ExchangePrefix + m.MessageType
	}
	if strings.ContainsAny(m.MessageType, "\x00\n") {
		return nil, fmt.Errorf("%w: message type %q contains control characters", ErrInvalidMessage, m.MessageType)
	}
	if err := b.orderingKey(msg, h); err != nil {
		return nil, err
	}
	if len(h) > 0 {
		m.Headers = h
	}
	// Refuse here what a transport or store could not carry later: at
	// relay time it would fail (or, on AMQP, close the connection) again
	// and again, long after the caller could have been told.
	if err := wire.Validate(m, wire.Edge); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	return m, nil
}

// DroppedCorrelationID logs, at debug level, an incoming correlation id that
// messages published by the consumer do not inherit because a publish would
// refuse it (the endpoint package calls it).
func (p consumerPublisher) DroppedCorrelationID(ctx context.Context, d *endpoint.Delivery, reason error) {
	p.b.log.DebugContext(ctx, "incoming correlation id not inherited by a follow-up publish",
		"message_id", d.MessageID, "endpoint", d.Endpoint, "reason", reason)
}

// Fault headers are bounded so that a dead letter always fits the frame
// (wire.MaxHeaderBytes leaves room for them): a huge error text must not
// make dead-lettering fail, and so the message loop.
const (
	maxFaultReason = 4 << 10
	maxFaultStack  = 16 << 10
)

// deliverDeadLetter publishes a dead letter. One to the endpoint's
// DeadLetterExchange is mandatory: when no queue is bound to receive it,
// it goes to the endpoint's error queue instead, with
// BW-Fault-Unroutable naming the exchange, rather than vanishing while the
// original is acked (and rather than being requeued forever).
func (b *Bus) deliverDeadLetter(ctx context.Context, ep *endpoint.Endpoint, m *outbox.Message) error {
	md, ok := b.tr.(transport.MandatoryDeliverer)
	if !ok || ep.Queue.DeadLetterExchange == "" {
		return b.tr.Deliver(ctx, []*outbox.Message{m})[0]
	}
	err := md.DeliverMandatory(ctx, []*outbox.Message{m})[0]
	if !errors.Is(err, transport.ErrUnroutable) || ep.ErrorQueue == "" {
		return err
	}
	b.log.WarnContext(ctx, "dead-letter exchange routed the dead letter to no queue; sent to the error queue instead",
		"endpoint", ep.Name(), "message_id", m.MessageID, "dead_letter_exchange", ep.Queue.DeadLetterExchange,
		"routing_key", m.RoutingKey, "error_queue", ep.ErrorQueue)
	fb := *m
	fb.Headers = maps.Clone(m.Headers)
	fb.Headers[wire.HeaderFaultUnroutable] = fmt.Sprintf("exchange %q with routing key %q routed it to no queue", ep.Queue.DeadLetterExchange, m.RoutingKey)
	fb.Destination, fb.RoutingKey = wire.QueuePrefix+ep.ErrorQueue, ""
	return b.tr.Deliver(ctx, []*outbox.Message{&fb})[0]
}
