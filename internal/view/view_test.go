package view_test

import (
	"testing"
	"time"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/view"
	"github.com/barewire-go/barewire/outbox"
)

func TestInboxStates(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	done := now.Add(-time.Minute)
	for _, c := range []struct {
		e    inbox.Entry
		want string
	}{
		{inbox.Entry{ProcessedAt: &done, ExpiresAt: now.Add(time.Hour)}, view.StateProcessed},
		{inbox.Entry{ExpiresAt: now.Add(time.Second)}, view.StateLocked},
		{inbox.Entry{ExpiresAt: now}, view.StateExpired},
		{inbox.Entry{ExpiresAt: now.Add(-time.Second)}, view.StateExpired},
	} {
		if got := view.Inbox(c.e, now).State; got != c.want {
			t.Errorf("%+v: state %q, want %q", c.e, got, c.want)
		}
	}
}

func TestOutboxRowHidesPayload(t *testing.T) {
	local := time.FixedZone("X", 3600)
	delivered := time.Date(2026, 1, 1, 1, 0, 0, 0, local)
	r := view.Outbox(&outbox.Message{ID: 7, MessageID: "m", Payload: []byte("secret body"), Status: outbox.StatusDelivered,
		CreatedAt: delivered, DeliveredAt: &delivered})
	if r.PayloadBytes != 11 || r.Status != "delivered" || r.DeliveredAt == nil || r.CreatedAt.Location() != time.UTC || r.DeliveredAt.Location() != time.UTC {
		t.Fatalf("%+v", r)
	}
	if rs := view.Outboxes([]*outbox.Message{{ID: 1}, {ID: 2}}); len(rs) != 2 || rs[1].ID != 2 || rs[1].DeliveredAt != nil {
		t.Fatalf("%+v", rs)
	}
}
