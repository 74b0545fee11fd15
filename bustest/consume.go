package bustest

import (
	"context"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/plumb"
	"github.com/barewire-go/barewire/internal/wire"
)

// Result is what Consume saw one consumer call do.
type Result struct {
	// Err is the consumer's error; nil means its transaction committed.
	Err error
	// Published are the messages it published or sent (outbox rows, in
	// its transaction): Committed when it succeeded, RolledBack otherwise.
	Published []Record
}

// Consume runs fn once on msg, as an endpoint would (in a transaction on
// the harness's database, with publishing through the outbox), without
// starting endpoints or the inbox: a unit test of one consumer. Read what
// fn wrote through h.Bus.DB(); Published says what it published, and the
// relay sends it on as usual. headers may set "message-id" and
// "correlation-id".
func Consume[T any](h *Harness, fn endpoint.HandleFunc[T], msg T, headers bus.Headers) Result {
	h.t.Helper()
	if fn == nil {
		h.t.Fatalf("bustest: Consume: consumer function is nil")
		return Result{}
	}
	body, err := endpoint.JSON.Marshal(msg)
	if err != nil {
		h.t.Fatalf("bustest: Consume: marshal %T: %v", msg, err)
	}
	id := headers[bus.HeaderMessageID]
	if id == "" {
		id = wire.NewID()
	}
	hd := bus.Headers{}
	for k, v := range headers {
		hd[k] = v
	}
	typ := typeOf[T]()
	hd[bus.HeaderMessageType] = typ
	d := endpoint.NewDelivery(plumb.Token{}, endpoint.Delivery{
		MessageID: id, CorrelationID: headers[bus.HeaderCorrelationID], MessageType: typ,
		ContentType: endpoint.JSON.ContentType(), Headers: hd, Body: body, Endpoint: "bustest.Consume", Attempt: 1,
	}, publisher{h.Bus})

	h.mu.Lock()
	from := len(h.records)
	h.mu.Unlock()
	var fnErr error
	ctx := context.Background()
	err = h.Bus.Transaction(ctx, func(tx *gorm.DB) error {
		fnErr = callSafely(func() error {
			return fn(gormstore.WithTx(ctx, tx), &endpoint.Context[T]{Delivery: d, Message: msg})
		})
		return fnErr
	})
	if err != nil && fnErr == nil {
		h.t.Fatalf("bustest: Consume: transaction: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	res := Result{Err: fnErr}
	for _, r := range h.records[from:] {
		if r.Kind == KindPublished && r.inTx && r.ParentID == "" {
			r.Committed, r.RolledBack = fnErr == nil, fnErr != nil
			res.Published = append(res.Published, *r)
		}
	}
	return res
}

type publisher struct{ b *bus.Bus }

func (p publisher) Publish(ctx context.Context, msg any, h endpoint.Headers) error {
	return p.b.Publish(ctx, msg, h)
}

func (p publisher) Send(ctx context.Context, dest string, msg any, h endpoint.Headers) error {
	return p.b.Send(ctx, dest, msg, h)
}

// CancelScheduled lets a consumer under Consume cancel a scheduled message
// (endpoint.Delivery.CancelScheduled) in its transaction, as on the bus.
func (p publisher) CancelScheduled(ctx context.Context, messageID string) (bool, error) {
	if tx, ok := gormstore.TxFromContext(ctx); ok {
		return p.b.CancelScheduledTx(ctx, tx, messageID)
	}
	return p.b.CancelScheduled(ctx, messageID)
}

// callSafely turns a consumer's panic into an error, as the bus does.
func callSafely(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &bus.PanicError{Value: v}
		}
	}()
	return fn()
}
