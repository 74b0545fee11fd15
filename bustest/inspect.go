package bustest

import (
	"context"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// InboxEntries returns the inbox entries of the run (newest first, at
// most 1000): one per message and endpoint, processed or locked.
func (h *Harness) InboxEntries(ctx context.Context) []inbox.Entry {
	h.t.Helper()
	es, err := h.Bus.InboxStore().List(ctx, inbox.Query{Limit: 1000})
	if err != nil {
		h.t.Fatalf("bustest: list inbox entries: %v", err)
	}
	return es
}

// OutboxRows returns the outbox rows of the run (oldest first, at most
// 1000), delivered ones included unless the bus deletes them on delivery.
func (h *Harness) OutboxRows(ctx context.Context) []*outbox.Message {
	h.t.Helper()
	ms, err := h.Bus.OutboxStore().List(ctx, outbox.Query{Limit: 1000})
	if err != nil {
		h.t.Fatalf("bustest: list outbox rows: %v", err)
	}
	return ms
}
