package bus

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
)

// Raw is a message whose body is already serialized. Publish, Send and
// their Tx twins send its Body as it is.
type Raw struct {
	// Type is the message type (BW-MessageType); required for Publish.
	Type        string
	ContentType string // Defaults to application/octet-stream.
	Body        []byte
}

// maxIDLen bounds message ids so that they fit the inbox key.
const maxIDLen = 200

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
// not commit tx.
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
func (b *Bus) Transaction(ctx context.Context, fn func(tx *gorm.DB) error) error {
	if b.db == nil {
		return ErrNotStarted
	}
	err := b.db.WithContext(ctx).Transaction(fn)
	if err == nil {
		b.wake()
	}
	return err
}

func (b *Bus) wake() {
	// Not b.mu: Stop holds it while it waits for the consumers that call this.
	if r := b.wakeRelay.Load(); r != nil {
		r.Wake()
	}
}

func (b *Bus) route(ctx context.Context, tx *gorm.DB, destination string, msg any, headers Headers) (err error) {
	m, err := b.envelope(destination, msg, headers)
	if err != nil {
		return err
	}
	ctx, endSpan := b.startPublish(ctx, tx, m) // telemetry.go: span, trace context into m.Headers
	direct := false
	defer func() { endSpan(err, direct) }()
	if tx == nil {
		if ctxTx, ok := gormstore.TxFromContext(ctx); ok {
			tx = ctxTx
			if st := stateFrom(ctx); st != nil {
				st.published.Store(true)
			}
		}
	}
	if tx != nil {
		// A transport that writes in the caller's transaction (PostgreSQL
		// on the same database) needs no outbox row and no relay hop.
		if done, err := b.deliverInTx(ctx, tx, m); done {
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
		b.wake()
		return nil
	}
	b.mu.Lock()
	started := b.state == 1
	b.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	if b.cfg.outboxOpts.PublishThroughOutbox {
		return b.Transaction(ctx, func(tx *gorm.DB) error {
			return b.outboxSt.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{m})
		})
	}
	if err := b.tr.Deliver(ctx, []*outbox.Message{m})[0]; err != nil {
		return fmt.Errorf("bus: publish %s %s: %w", m.MessageType, m.MessageID, err)
	}
	return nil
}

// envelope serializes msg and resolves its id, type and destination.
func (b *Bus) envelope(destination string, msg any, headers Headers) (*outbox.Message, error) {
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
	if len(m.MessageID) > maxIDLen {
		return nil, fmt.Errorf("%w: message-id is %d bytes; at most %d", ErrInvalidMessage, len(m.MessageID), maxIDLen)
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
		return b.envelope(destination, *v, headers)
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
	if len(h) > 0 {
		m.Headers = h
	}
	return m, nil
}
