// Package view holds the JSON shapes of inbox entries and outbox rows that
// the admin HTTP API (package admin) and the barewire command print, so
// that both show the same fields with the same names and states.
package view

import (
	"time"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// Inbox entry states.
const (
	StateProcessed = "processed" // the consumer's effect committed
	StateLocked    = "locked"    // a delivery holds the entry now
	StateExpired   = "expired"   // a lock released or run out, waiting for a redelivery
)

// InboxEntry is one inbox entry as operators see it.
type InboxEntry struct {
	MessageID    string `json:"messageId"`
	ConsumerType string `json:"consumerType"`
	// State is processed, locked or expired (see the constants).
	State       string     `json:"state"`
	ReceivedAt  time.Time  `json:"receivedAt"`
	ProcessedAt *time.Time `json:"processedAt,omitempty"`
	ExpiresAt   time.Time  `json:"expiresAt"`
	Attempts    int        `json:"attempts"`
}

// Inbox returns the view of e as of now (which decides locked or expired).
func Inbox(e inbox.Entry, now time.Time) InboxEntry {
	out := InboxEntry{
		MessageID: e.MessageID, ConsumerType: e.ConsumerType, ReceivedAt: e.ReceivedAt.UTC(),
		ExpiresAt: e.ExpiresAt.UTC(), Attempts: e.Attempts, State: StateExpired,
	}
	switch {
	case e.ProcessedAt != nil:
		t := e.ProcessedAt.UTC()
		out.ProcessedAt, out.State = &t, StateProcessed
	case e.ExpiresAt.After(now):
		out.State = StateLocked
	}
	return out
}

// Inboxes returns the views of entries as of now.
func Inboxes(entries []inbox.Entry, now time.Time) []InboxEntry {
	out := make([]InboxEntry, len(entries))
	for i, e := range entries {
		out[i] = Inbox(e, now)
	}
	return out
}

// OutboxRow is one outbox row as operators see it: everything but the
// payload, whose size is given.
type OutboxRow struct {
	ID            int64             `json:"id"`
	MessageID     string            `json:"messageId"`
	MessageType   string            `json:"messageType"`
	Destination   string            `json:"destination"`
	RoutingKey    string            `json:"routingKey,omitempty"`
	ContentType   string            `json:"contentType,omitempty"`
	CorrelationID string            `json:"correlationId,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	PayloadBytes  int               `json:"payloadBytes"`
	Status        string            `json:"status"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"lastError,omitempty"`
	CreatedAt     time.Time         `json:"createdAt"`
	DeliveredAt   *time.Time        `json:"deliveredAt,omitempty"`
	// AvailableAt is when a pending row becomes due: in the future for a
	// scheduled message or a delayed redelivery.
	AvailableAt *time.Time `json:"availableAt,omitempty"`
}

// Outbox returns the view of m.
func Outbox(m *outbox.Message) OutboxRow {
	row := OutboxRow{
		ID: m.ID, MessageID: m.MessageID, MessageType: m.MessageType, Destination: m.Destination,
		RoutingKey: m.RoutingKey, ContentType: m.ContentType, CorrelationID: m.CorrelationID,
		Headers: m.Headers, PayloadBytes: len(m.Payload), Status: string(m.Status), Attempts: m.Attempts,
		LastError: m.LastError, CreatedAt: m.CreatedAt.UTC(),
	}
	if m.DeliveredAt != nil {
		t := m.DeliveredAt.UTC()
		row.DeliveredAt = &t
	}
	if !m.AvailableAt.IsZero() {
		t := m.AvailableAt.UTC()
		row.AvailableAt = &t
	}
	return row
}

// Outboxes returns the views of msgs.
func Outboxes(msgs []*outbox.Message) []OutboxRow {
	out := make([]OutboxRow, len(msgs))
	for i, m := range msgs {
		out[i] = Outbox(m)
	}
	return out
}
