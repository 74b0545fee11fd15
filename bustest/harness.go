package bustest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/plumb"
)

// T is what the harness needs of a test: *testing.T and *testing.B
// satisfy it.
type T interface {
	Helper()
	Name() string
	Cleanup(func())
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// DefaultTimeout bounds each wait when the test has no earlier deadline.
const DefaultTimeout = 10 * time.Second

// Kind says what a Record is.
type Kind int

// Kinds of records.
const (
	// KindHandled: an endpoint finished handling a delivery (see Outcome).
	KindHandled Kind = iota + 1
	// KindRetried: an attempt failed and was retried in process.
	KindRetried
	// KindPublished: a message was published (directly or to the outbox).
	KindPublished
)

func (k Kind) String() string {
	switch k {
	case KindHandled:
		return "handled"
	case KindRetried:
		return "retried"
	case KindPublished:
		return "published"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Record is one thing the harness saw the bus do.
type Record struct {
	Kind        Kind
	Seq         int // order of arrival, from 1
	Time        time.Time
	Endpoint    string // KindHandled, KindRetried
	MessageType string
	MessageID   string
	Destination string // KindPublished: "exchange:<type>" or "queue:<name>"
	// Outcome of a KindHandled record: bus.OutcomeCommitted, OutcomeDuplicate,
	// OutcomeDeadLettered, OutcomeRedelivery, OutcomeRequeued or OutcomeAcked.
	Outcome string
	Err     error // the consumer's error (KindRetried, dead-lettered, redelivery)
	Attempt int
	// Headers as received, or as published; a dead letter's include the
	// fault headers (bus.HeaderFaultReason, ...).
	Headers map[string]string
	Body    []byte
	// Outbox says a KindPublished message went through the outbox; Committed
	// that it is known to be sent: a direct publish the transport
	// confirmed, or an outbox row whose transaction committed (the
	// consumer's delivery committed, or the relay delivered the row);
	// RolledBack that its consumer's attempt failed, so it never leaves;
	// Relayed that the relay had the row confirmed by the transport.
	Outbox, Committed, RolledBack, Relayed bool
	// ParentEndpoint and ParentID name the delivery that published it
	// from a consumer; ParentAttempt its attempt.
	ParentEndpoint, ParentID string
	ParentAttempt            int

	inTx bool // written in a transaction: committed only when it is known to have committed
}

// Decode unmarshals the record's body (JSON, the bus's default serializer)
// into v.
func (r *Record) Decode(v any) error { return endpoint.JSON.Unmarshal(r.Body, v) }

// Seen is one delivery as a consumer received it.
type Seen struct {
	Endpoint, Consumer     string
	MessageType, MessageID string
	Attempt                int
	Headers                map[string]string
	Body                   []byte
}

// Harness is a started bus under test and what it has done. Create it
// with New; it stops with the test.
type Harness struct {
	// Bus is the bus under test: publish and send on it as the service does.
	Bus *bus.Bus
	// Timeout bounds each wait; the test's own deadline bounds it too.
	// Defaults to DefaultTimeout.
	Timeout time.Duration

	t     T
	label string

	mu      sync.Mutex
	records []*Record
	seen    []Seen
	changed chan struct{} // closed and replaced on every record
	faults  map[string]*fault
	clock   *Clock // nil on PostgreSQL
}

var harnessSeq atomic.Int64

// New builds and starts a bus with opts (bus.WithTransport with the
// service's own endpoint declarations: on inproc.New for the embedded
// default, or on rabbitmq.New / pgtransport.New, with bus.WithDatabase, to
// run on real services), records what it does, and stops it when the test
// ends, failing the test if the bus's goroutines outlive it. Safe with
// t.Parallel: every harness has its own bus and, on the embedded default,
// its own in-memory database.
func New(t T, opts ...bus.Option) *Harness {
	t.Helper()
	h := &Harness{
		t: t, Timeout: DefaultTimeout, changed: make(chan struct{}), faults: map[string]*fault{},
		label: fmt.Sprintf("%d", harnessSeq.Add(1)),
	}
	// The harness's own options come first so that the service's win.
	all := append([]bus.Option{bus.WithLogger(testLogger(t)), bus.WithStopTimeout(10 * time.Second)}, opts...)
	all = append(all, bus.WithObserver(h.observe))
	// The fake clock where the database can read it: on PostgreSQL the
	// database's clock decides, and the bus is built without one.
	h.clock = newClock()
	b, err := bus.New(append(all, bus.WithClock(h.clock))...)
	if errors.Is(err, bus.ErrClockUnsupported) {
		h.clock = nil
		b, err = bus.New(all...)
	}
	if err != nil {
		t.Fatalf("bustest: bus.New: %v", err)
		return nil
	}
	h.Bus = b
	h.wrapConsumers()
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout())
	defer cancel()
	// Every goroutine the bus starts inherits this label: the leak check
	// finds this bus's goroutines among those of parallel tests.
	pprof.Do(ctx, pprof.Labels(leakLabel, h.label), func(ctx context.Context) { err = b.Start(ctx) })
	if err != nil {
		t.Fatalf("bustest: start bus: %v", err)
		return nil
	}
	t.Cleanup(h.stop)
	return h
}

func (h *Harness) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	pprof.Do(ctx, pprof.Labels(leakLabel, h.label), func(ctx context.Context) { err = h.Bus.Stop(ctx) })
	if err != nil {
		h.t.Errorf("bustest: stop bus: %v", err)
	}
	if leaked := leakedGoroutines(h.label, 2*time.Second); leaked != "" {
		h.t.Errorf("bustest: goroutines of the bus still running after Stop:\n%s", leaked)
	}
}

// testLogger logs warnings and errors through t.Logf: shown when the test
// fails or runs with -v.
func testLogger(t T) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type logWriter struct{ t T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

var _ io.Writer = logWriter{}

// observe turns the bus's events into records; it runs on the bus's
// goroutines.
func (h *Harness) observe(ev bus.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	add := func(r *Record) {
		r.Seq = len(h.records) + 1
		h.records = append(h.records, r)
	}
	switch ev.Kind {
	case bus.EventHandled, bus.EventRetried:
		k := KindHandled
		if ev.Kind == bus.EventRetried {
			k = KindRetried
		}
		add(&Record{Kind: k, Time: ev.Time, Endpoint: ev.Endpoint, MessageType: ev.MessageType, MessageID: ev.MessageID,
			Outcome: ev.Outcome, Err: ev.Err, Attempt: ev.Attempt, Headers: ev.Headers, Body: ev.Body})
		if ev.Kind == bus.EventHandled {
			// Settle what the delivery's consumers wrote to the outbox: the
			// last attempt's rows committed with it, earlier ones rolled back.
			for _, r := range h.records {
				if r.Kind != KindPublished || !r.inTx || r.ParentID != ev.MessageID || r.ParentEndpoint != ev.Endpoint || r.Committed || r.RolledBack {
					continue
				}
				if ev.Outcome == bus.OutcomeCommitted && r.ParentAttempt == ev.Attempt {
					r.Committed = true
				} else {
					r.RolledBack = true
				}
			}
		}
	case bus.EventPublished:
		add(&Record{Kind: KindPublished, Time: ev.Time, MessageType: ev.MessageType, MessageID: ev.MessageID,
			Destination: ev.Destination, Headers: ev.Headers, Body: ev.Body, Outbox: ev.Outbox, Committed: !ev.InTx, inTx: ev.InTx,
			ParentEndpoint: ev.ParentEndpoint, ParentID: ev.ParentID, ParentAttempt: ev.ParentAttempt})
	case bus.EventRelayed:
		found := false
		for _, r := range h.records {
			if r.Kind == KindPublished && r.inTx && r.Outbox == ev.Outbox && !r.Relayed && !r.RolledBack &&
				r.MessageID == ev.MessageID && r.Destination == ev.Destination {
				r.Relayed, r.Committed, found = ev.Outbox, true, true
				break
			}
		}
		if !found && ev.Outbox { // a row written before the harness started
			add(&Record{Kind: KindPublished, Time: ev.Time, MessageType: ev.MessageType, MessageID: ev.MessageID,
				Destination: ev.Destination, Headers: ev.Headers, Body: ev.Body, Outbox: true, Committed: true, Relayed: true})
		}
	case bus.EventSettled:
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// Records returns a copy of everything recorded so far, in order.
func (h *Harness) Records() []Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Record, len(h.records))
	for i, r := range h.records {
		out[i] = *r
	}
	return out
}

// Seen returns the deliveries the consumers of endpoint received, in the
// order they received them (every attempt, not duplicates the inbox
// skipped). An empty endpoint means every endpoint.
func (h *Harness) Seen(endpointName string) []Seen {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Seen
	for _, s := range h.seen {
		if endpointName == "" || s.Endpoint == endpointName {
			out = append(out, s)
		}
	}
	return out
}

// wrapConsumers records every delivery a consumer receives and applies
// injected faults. The registrations belong to this bus's declarations.
func (h *Harness) wrapConsumers() {
	for _, ep := range h.Bus.Endpoints() {
		for _, r := range ep.Consumers() {
			name, epName := r.Name, ep.Name()
			r.WrapHandle(plumb.Token{}, func(next endpoint.DeliveryFunc) endpoint.DeliveryFunc {
				return func(ctx context.Context, d *endpoint.Delivery) error {
					h.mu.Lock()
					h.seen = append(h.seen, Seen{Endpoint: epName, Consumer: name, MessageType: d.MessageType,
						MessageID: d.MessageID, Attempt: d.Attempt, Headers: d.Headers, Body: d.Body})
					err := h.takeFault(d.MessageType)
					h.mu.Unlock()
					if err != nil {
						return err
					}
					return next(ctx, d)
				}
			})
		}
	}
}

func (h *Harness) timeout() time.Duration {
	d := h.Timeout
	if d <= 0 {
		d = DefaultTimeout
	}
	if dt, ok := h.t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := dt.Deadline(); ok {
			// Leave the test time to report.
			if left := time.Until(dl) * 9 / 10; left < d {
				d = max(left, 0)
			}
		}
	}
	return d
}

func typeOf[T any]() string { return endpoint.TypeNameOf[T]() }

func decode[T any](r *Record) (T, error) {
	var v T
	if len(r.Body) == 0 {
		return v, nil
	}
	err := json.Unmarshal(r.Body, &v)
	return v, err
}
