package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/detach"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
)

// deadLetterRefusals is how many times the transport may refuse one form
// of a dead letter before the next form is tried: the full dead letter,
// then the reduced one (reducedDeadLetter), then an outbox row. A refusal
// is any error but one wrapping outbox.ErrTransportUnavailable (the broker
// did not judge the message; waited out uncounted, as the relay does); one
// wrapping outbox.ErrUndeliverable moves to the next form at once.
const deadLetterRefusals = 3

// maxDroppedReason bounds the transport's error quoted in
// BW-Fault-HeadersDropped.
const maxDroppedReason = 1 << 10

// How a dead letter left (delivery.deadLetterForm).
const (
	deadLetterFull    = ""
	deadLetterReduced = "reduced" // without the received message's headers
	deadLetterOutbox  = "outbox"  // written to the outbox for the relay
)

// settleDeadLetter publishes dl and returns the form that went, or an
// error when the bus stopped first (the message is then handed back to the
// broker). Each form is tried until the transport takes it, backing off
// (100 ms doubling-ish up to 10 s) while the transport is unavailable; after
// deadLetterRefusals refusals of the full dead letter the reduced one is
// tried, and after as many refusals of that it is written to the outbox
// (in a transaction of its own) for the endpoint's error queue, for the relay, which retries it per
// MaxAttempts and then parks it, where OutboxStore lists it with its last
// error and Requeue sends it again. Only then is the original acked: the
// dead letter is on the broker or in the database, never only in memory.
// A failing outbox write is the database's failure and is waited out like
// one, uncounted.
func (b *Bus) settleDeadLetter(ctx context.Context, ep *endpoint.Endpoint, log *slog.Logger, dl *outbox.Message) (string, error) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = 10 * time.Second
	form, m := deadLetterFull, dl
	refusals := 0
	for n := 1; ; n++ {
		sctx, cancel := detach.From(ctx)
		var err error
		if form == deadLetterOutbox {
			err = b.inTx(sctx, func(tctx context.Context) error { return b.outboxSt.Add(tctx, []*outbox.Message{m}) })
			if err == nil {
				b.wake()
			}
		} else {
			err = b.deliverDeadLetter(sctx, ep, m)
		}
		cancel()
		if err == nil {
			return form, nil
		}
		if form != deadLetterOutbox && !errors.Is(err, outbox.ErrTransportUnavailable) {
			refusals++
			if refusals >= deadLetterRefusals || errors.Is(err, outbox.ErrUndeliverable) {
				log.WarnContext(ctx, "the transport refused the dead letter", "message_id", m.MessageID,
					"form", formName(form), "refusals", refusals, "error", err)
				if form == deadLetterFull {
					form, m = deadLetterReduced, reducedDeadLetter(dl, err, refusals)
				} else {
					form = deadLetterOutbox
					c := *m
					if c.MessageID == "" { // an outbox row needs an id; the message had none
						c.MessageID = wire.NewID()
					}
					// The relay publishes non-mandatory: a row for a dead-letter
					// exchange that routes nowhere would vanish. The error queue
					// (always declared) cannot.
					if ep.Queue.DeadLetterExchange != "" && ep.ErrorQueue != "" {
						c.Destination, c.RoutingKey = wire.QueuePrefix+ep.ErrorQueue, ""
					}
					m = &c
				}
				refusals = 0
				bo.Reset()
				continue
			}
		}
		select {
		case <-ctx.Done():
		case <-b.gate.stopping():
		default:
			d := bo.NextBackOff()
			log.WarnContext(ctx, "dead-lettering failed; trying again", "message_id", m.MessageID,
				"form", formName(form), "error", err, "try", n, "retry_in", d)
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
			case <-b.gate.stopping():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		log.WarnContext(ctx, "dead-lettering failed while stopping; message handed back to the broker", "error", err)
		return form, err
	}
}

func formName(form string) string {
	if form == deadLetterFull {
		return "full"
	}
	return form
}

// reducedDeadLetter is dl without the received message's own headers
// (its user headers, trace context, redelivery count): the body, id, type,
// content type, correlation id (when any transport can carry it) and the
// fault headers, plus BW-Fault-HeadersDropped saying what was dropped and
// why. It is what a transport that refused dl (headers that no longer fit
// a frame once the fault headers are added, say) still takes.
func reducedDeadLetter(dl *outbox.Message, refusal error, refusals int) *outbox.Message {
	r := *dl
	r.Headers = make(map[string]string, 12)
	dropped, size := 0, 0
	for k, v := range dl.Headers {
		if strings.HasPrefix(k, "BW-Fault-") {
			r.Headers[k] = v
			continue
		}
		dropped++
		size += len(k) + len(v)
	}
	note := ""
	if r.CorrelationID != "" {
		if wire.Validate(&outbox.Message{MessageID: "x", CorrelationID: r.CorrelationID}, wire.Edge) != nil {
			r.CorrelationID = ""
			note = " and the correlation id"
		}
	}
	r.Headers[wire.HeaderFaultHeadersDropped] = fmt.Sprintf("%d headers (%d bytes)%s dropped: the transport refused the dead letter with them %d times: %s",
		dropped, size, note, refusals, wire.Truncate(refusal.Error(), maxDroppedReason))
	return &r
}
