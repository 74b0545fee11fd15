package bus

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/barewire-go/barewire/outbox"
)

// The consume engine and the publish path report each thing they do once,
// to b.obs, which hands it to every observer: OpenTelemetry (telemetry.go),
// Stats' counters (stats.go) and the WithObserver functions (events.go).
// Every count is derived from the same call, so Stats and the metrics agree.

// observer is told what the bus did, synchronously, on the goroutine that
// did it.
type observer interface {
	// started: a delivery reached its endpoint's handler. The context
	// returned is the delivery's (an observer may add its span to it).
	started(ctx context.Context, d *delivery) context.Context
	// attemptFailed: attempt d.attempt failed with d.lastErr, counted
	// against the retry policy.
	attemptFailed(ctx context.Context, d *delivery)
	// retried: that failed attempt is retried in process.
	retried(ctx context.Context, d *delivery)
	// handled: the delivery's handling ended with d.outcome.
	handled(ctx context.Context, d *delivery)
	// published: Publish, Send or a Tx twin accepted m. inTx: it was
	// written in a transaction that may still roll back; viaOutbox: as an
	// outbox row (else in the PostgreSQL transport's table, when inTx).
	published(ctx context.Context, m *outbox.Message, viaOutbox, inTx bool)
	// delivered: messages written in transactions reached the transport:
	// outbox rows the relay had confirmed (viaOutbox), or messages the
	// PostgreSQL transport saw commit.
	delivered(msgs []*outbox.Message, viaOutbox bool)
	// outage: consumption paused for a database outage (down) or resumed.
	outage(ctx context.Context, down bool)
	// settled: the embedded transport settled a delivery or released a
	// delayed one.
	settled()
	// batched: a group-commit worker of endpoint settled n messages
	// through one transaction (n 1: the per-message path).
	batched(endpoint string, n int)
}

// nopObserver lets an observer implement only what it uses.
type nopObserver struct{}

func (nopObserver) started(ctx context.Context, _ *delivery) context.Context { return ctx }
func (nopObserver) attemptFailed(context.Context, *delivery)                 {}
func (nopObserver) retried(context.Context, *delivery)                       {}
func (nopObserver) handled(context.Context, *delivery)                       {}
func (nopObserver) published(context.Context, *outbox.Message, bool, bool)   {}
func (nopObserver) delivered([]*outbox.Message, bool)                        {}
func (nopObserver) outage(context.Context, bool)                             {}
func (nopObserver) settled()                                                 {}
func (nopObserver) batched(string, int)                                      {}

// fanout is the bus's one observer: it calls each of its observers in turn.
type fanout []observer

// newFanout orders the observers so that whoever sees a count in Stats
// finds it in the metrics too, and a WithObserver function (a test waiting
// for a condition on Stats) sees Stats already moved.
func newFanout(tel *telemetry, stats *counters, fns []func(Event)) fanout {
	f := fanout{tel, stats}
	if len(fns) > 0 {
		f = append(f, eventObserver{fns: fns})
	}
	return f
}

func (f fanout) started(ctx context.Context, d *delivery) context.Context {
	for _, o := range f {
		ctx = o.started(ctx, d)
	}
	return ctx
}

func (f fanout) attemptFailed(ctx context.Context, d *delivery) {
	for _, o := range f {
		o.attemptFailed(ctx, d)
	}
}

func (f fanout) retried(ctx context.Context, d *delivery) {
	for _, o := range f {
		o.retried(ctx, d)
	}
}

func (f fanout) handled(ctx context.Context, d *delivery) {
	for _, o := range f {
		o.handled(ctx, d)
	}
}

func (f fanout) published(ctx context.Context, m *outbox.Message, viaOutbox, inTx bool) {
	for _, o := range f {
		o.published(ctx, m, viaOutbox, inTx)
	}
}

func (f fanout) delivered(msgs []*outbox.Message, viaOutbox bool) {
	for _, o := range f {
		o.delivered(msgs, viaOutbox)
	}
}

func (f fanout) outage(ctx context.Context, down bool) {
	for _, o := range f {
		o.outage(ctx, down)
	}
}

func (f fanout) settled() {
	for _, o := range f {
		o.settled()
	}
}

func (f fanout) batched(endpoint string, n int) {
	for _, o := range f {
		o.batched(endpoint, n)
	}
}

type deliveryKey struct{}

// delivery is one delivery's handling as the engine reports it. The
// engine's fields are written on the handler's goroutine; attempt is also
// read by publishes of the consumers.
type delivery struct {
	msg         *message.Message
	endpoint    string
	messageType string // BW-MessageType as received
	knownType   bool   // one of the endpoint's consumed types
	start       time.Time

	attempt      atomic.Int64      // the attempt running, or the last one; 0 before the first
	lastErr      error             // the last failed attempt's error
	faultHeaders map[string]string // what the dead letter carries
	// deadLetterForm is how the dead letter left: deadLetterFull (""),
	// deadLetterReduced or deadLetterOutbox.
	deadLetterForm string
	outcome        string // Outcome*, set before handled
	// keptLock is the token of an inbox lock a failed attempt could not
	// release (the database failed under it): the next attempt releases it
	// first rather than wait InboxLockTimeout for it to expire. Set by the
	// attempt (or its batch worker, before the attempt's done is closed)
	// and read by consume between attempts.
	keptLock string

	// telemetry.go's: the process span and the metric attributes.
	span  trace.Span
	attrs *deliveryAttrs
}

func deliveryFrom(ctx context.Context) *delivery {
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	return d
}
