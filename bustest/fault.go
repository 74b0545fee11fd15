package bustest

import (
	"context"
	"fmt"
	"maps"

	"github.com/barewire-go/barewire/bus"
)

type fault struct {
	left int
	err  error
}

// FailNext makes the next n attempts to consume a message of type T fail
// with err (before the consumer runs), on every endpoint: the failures go
// through the endpoint's retry, redelivery and dead-letter policy like a
// consumer's own error. A nil err means a generic injected error.
func FailNext[T any](h *Harness, n int, err error) {
	h.FailNextType(typeOf[T](), n, err)
}

// FailNextType is FailNext for a message type given by its wire name.
func (h *Harness) FailNextType(messageType string, n int, err error) {
	h.t.Helper()
	if n < 0 {
		h.t.Fatalf("bustest: FailNext: n is %d; must be 0 or more", n)
		return
	}
	if err == nil {
		err = fmt.Errorf("bustest: injected failure of %s", messageType)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults[messageType] = &fault{left: n, err: err}
}

// takeFault returns the injected error for the next attempt on typ, if
// any. Called with h.mu held.
func (h *Harness) takeFault(typ string) error {
	f := h.faults[typ]
	if f == nil || f.left == 0 {
		return nil
	}
	f.left--
	return f.err
}

// Redeliver sends the message r recorded (a delivery, or a publication)
// again to endpoint's queue with the same id, type, body and headers: the
// duplicate a broker's redelivery or a producer's retry makes, which the
// endpoint's inbox should skip once the first delivery committed. An empty
// endpoint means r's own.
func (h *Harness) Redeliver(ctx context.Context, r Record, endpointName string) {
	h.t.Helper()
	if endpointName == "" {
		endpointName = r.Endpoint
	}
	if endpointName == "" {
		h.t.Fatalf("bustest: Redeliver: record %d (%s %s) names no endpoint; pass one", r.Seq, r.MessageType, r.MessageID)
		return
	}
	hd := maps.Clone(r.Headers)
	if hd == nil {
		hd = bus.Headers{}
	}
	for _, k := range []string{bus.HeaderDestination, bus.HeaderRedelivered, bus.HeaderDeliveryCount,
		bus.HeaderMessageType, bus.HeaderContentType} {
		delete(hd, k)
	}
	hd[bus.HeaderMessageID] = r.MessageID
	raw := bus.Raw{Type: r.MessageType, ContentType: r.Headers[bus.HeaderContentType], Body: r.Body}
	if err := h.Bus.Send(ctx, "queue:"+endpointName, raw, hd); err != nil {
		h.t.Fatalf("bustest: Redeliver %s %s to %s: %v", r.MessageType, r.MessageID, endpointName, err)
	}
}
