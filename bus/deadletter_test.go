package bus_test

// Liveness of dead-lettering itself: a dead letter the transport refuses
// every time reaches a terminal state in bounded time (reduced, then the
// outbox), and a delivery that keeps meeting connection failures while the
// database answers probes is charged with them.

import (
	"bytes"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/inproc"
)

// wrapFactory is the in-process transport with the transport it builds
// wrapped (fault injection).
type wrapFactory struct {
	*inproc.Transport
	wrap func(transport.Transport) transport.Transport
}

func (f wrapFactory) Build(env transport.Env) (transport.Transport, error) {
	tr, err := f.Transport.Build(env)
	if err != nil {
		return nil, err
	}
	return f.wrap(tr), nil
}

// refusingTransport refuses, in Deliver, the messages refuse returns an
// error for, as a broker refuses a frame too large or a policy forbids.
type refusingTransport struct {
	transport.Transport
	refuse func(*outbox.Message) error
}

func (r *refusingTransport) Deliver(ctx context.Context, msgs []*outbox.Message) []error {
	errs := make([]error, len(msgs))
	var pass []*outbox.Message
	var idx []int
	for i, m := range msgs {
		if err := r.refuse(m); err != nil {
			errs[i] = err
			continue
		}
		pass, idx = append(pass, m), append(idx, i)
	}
	if len(pass) > 0 {
		for j, err := range r.Transport.Deliver(ctx, pass) {
			errs[idx[j]] = err
		}
	}
	return errs
}

// refusingEndpoint starts a bus whose endpoint name fails "poison" payments
// (no retry) and hands the others to good; its error queue's consumer
// feeds dls. refuse decides what the transport refuses.
func refusingEndpoint(t *testing.T, name string, refuse func(*outbox.Message) error, dls *deadLetters, good chan<- string, opts ...bus.Option) *bus.Bus {
	t.Helper()
	f := wrapFactory{
		Transport: inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint(name, func(e *endpoint.Endpoint) {
				e.Retry = endpoint.NoRetry()
				e.ConcurrentMessageLimit = 2
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
					if c.Message.PaymentID == "poison" {
						return errors.New("charge failed")
					}
					good <- c.MessageID
					return nil
				})
			})
			c.ReceiveEndpoint(name+"_error", dls.consumer)
		}),
		wrap: func(tr transport.Transport) transport.Transport {
			return &refusingTransport{Transport: tr, refuse: refuse}
		},
	}
	return start(t, append(opts, bus.WithTransport(f))...)
}

func receive(t *testing.T, ch <-chan string, within time.Duration, what string) string {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(within):
		t.Fatalf("%s: nothing within %v", what, within)
		return ""
	}
}

// TestRefusedDeadLetterSentWithoutItsHeaders: a dead letter the transport
// refuses with the received message's headers (they no longer fit once the
// fault headers are added) is sent, after deadLetterRefusals (3) refusals,
// without them: same id, type and body, the fault headers, and
// BW-Fault-HeadersDropped saying what was dropped and why. Before, it was
// retried every ≤ 10 s until the bus stopped. The neighbour sent after the
// first refusal is consumed meanwhile.
func TestRefusedDeadLetterSentWithoutItsHeaders(t *testing.T) {
	t.Parallel()
	const name = "dl-refused-headers"
	dls := newDeadLetters()
	good := make(chan string, 4)
	refused := make(chan string, 16)
	var refusals atomic.Int32
	b := refusingEndpoint(t, name, func(m *outbox.Message) error {
		if m.Destination == "queue:"+name+"_error" && m.Headers["x-big"] != "" {
			refusals.Add(1)
			refused <- m.MessageID
			return errors.New("frame too large: headers exceed the frame once the fault headers are added")
		}
		return nil
	}, dls, good, quiet())
	ctx := context.Background()
	began := time.Now()
	body := PaymentReceived{PaymentID: "poison", Amount: 7}
	if err := b.Publish(ctx, body, bus.Headers{bus.HeaderMessageID: "poison-1", "x-big": strings.Repeat("h", 2000), "x-tenant": "t1"}); err != nil {
		t.Fatal(err)
	}
	receive(t, refused, 10*time.Second, "first refusal of the dead letter")
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "neighbour"}, bus.Headers{bus.HeaderMessageID: "neighbour-1"}); err != nil {
		t.Fatal(err)
	}
	if id := receive(t, good, 5*time.Second, "neighbour while the dead letter is refused"); id != "neighbour-1" {
		t.Fatalf("consumed %q", id)
	}
	dl := dls.next(t, 10*time.Second, "a dead letter refused with its headers")
	took := time.Since(began)
	if dl.MessageID != "poison-1" || dl.MessageType != endpoint.TypeName(body) {
		t.Errorf("dead letter id %q type %q; want the original's", dl.MessageID, dl.MessageType)
	}
	if !bytes.Contains(dl.Body, []byte(`"poison"`)) {
		t.Errorf("dead letter body %s; want the original's", dl.Body)
	}
	if _, ok := dl.Headers["x-big"]; ok {
		t.Error("the reduced dead letter still carries x-big")
	}
	if _, ok := dl.Headers["x-tenant"]; ok {
		t.Error("the reduced dead letter still carries x-tenant")
	}
	if r := dl.Headers[bus.HeaderFaultReason]; !strings.Contains(r, "charge failed") {
		t.Errorf("%s = %q; want the consumer's error", bus.HeaderFaultReason, r)
	}
	dropped := dl.Headers[bus.HeaderFaultHeadersDropped]
	if !strings.Contains(dropped, "refused the dead letter with them 3 times") || !strings.Contains(dropped, "frame too large") {
		t.Errorf("%s = %q; want how many were dropped and the transport's error", bus.HeaderFaultHeadersDropped, dropped)
	}
	if n := refusals.Load(); n != 3 {
		t.Errorf("the full dead letter was refused %d times; want 3 before the reduced one", n)
	}
	waitFor(t, func() bool { return b.Stats().DeadLettered == 1 })
	if s := b.Stats(); s.DeadLettersReduced != 1 || s.DeadLettersToOutbox != 0 || s.Requeued != 0 {
		t.Errorf("stats %+v; want one reduced dead letter, nothing requeued", s)
	}
	if took > 5*time.Second {
		t.Errorf("dead-lettered %v after publishing; want within 5s (3 refusals, backoff from 100 ms)", took)
	}
	t.Logf("reduced dead letter %v after publishing; %s", took, dropped[:min(len(dropped), 80)])
}

// TestDeadLetterRefusedEvenReducedGoesToTheOutbox: a transport that
// refuses every dead letter, reduced or not, gets the reduced one as an
// outbox row: the original is acked (terminal: DeadLettered, one error log
// line with its id, DeadLettersToOutbox), the relay parks the row after
// MaxAttempts with the transport's error, and requeuing it once the
// transport takes it delivers it to the error queue. Nothing held a
// handler past the bound; the neighbour flowed.
func TestDeadLetterRefusedEvenReducedGoesToTheOutbox(t *testing.T) {
	t.Parallel()
	const name = "dl-refused-always"
	dls := newDeadLetters()
	good := make(chan string, 4)
	refused := make(chan string, 64)
	var accept atomic.Bool
	logs := &syncBuffer{}
	b := refusingEndpoint(t, name, func(m *outbox.Message) error {
		if m.Destination == "queue:"+name+"_error" && !accept.Load() {
			select {
			case refused <- m.MessageID:
			default:
			}
			return errors.New("access refused by a broker policy")
		}
		return nil
	}, dls, good,
		bus.WithLogger(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelError}))),
		bus.WithOutbox(func(o *outbox.Options) { o.MaxAttempts = 1 }))
	ctx := context.Background()
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "poison"}, bus.Headers{bus.HeaderMessageID: "poison-2", "x-tenant": "t1"}); err != nil {
		t.Fatal(err)
	}
	receive(t, refused, 10*time.Second, "first refusal of the dead letter")
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "neighbour"}, bus.Headers{bus.HeaderMessageID: "neighbour-2"}); err != nil {
		t.Fatal(err)
	}
	if id := receive(t, good, 5*time.Second, "neighbour while the dead letter is refused"); id != "neighbour-2" {
		t.Fatalf("consumed %q", id)
	}
	began := time.Now()
	waitFor(t, func() bool { s := b.Stats(); return s.DeadLettersToOutbox == 1 && s.InFlight == 0 }) // terminal within 10s
	t.Logf("written to the outbox %v after the neighbour", time.Since(began))
	if s := b.Stats(); s.DeadLettered != 1 || s.DeadLettersReduced != 0 || s.Requeued != 0 || s.InFlight != 0 {
		t.Errorf("stats %+v; want the original settled as dead-lettered through the outbox", s)
	}
	var row *outbox.Message
	waitFor(t, func() bool {
		rows, err := b.OutboxStore().List(ctx, outbox.Query{Status: outbox.StatusParked})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.MessageID == "poison-2" {
				row = r
				return true
			}
		}
		return false
	})
	if row.Destination != "queue:"+name+"_error" || row.Headers[bus.HeaderFaultHeadersDropped] == "" || row.Headers["x-tenant"] != "" ||
		!strings.Contains(row.Headers[bus.HeaderFaultReason], "charge failed") || !strings.Contains(row.LastError, "access refused") {
		t.Errorf("parked row: destination %q headers %v last error %q", row.Destination, row.Headers, row.LastError)
	}
	var errorLines int
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, `"level":"ERROR"`) && strings.Contains(l, `"message_id":"poison-2"`) && strings.Contains(l, "written to the outbox") {
			errorLines++
		}
	}
	if errorLines != 1 {
		t.Errorf("%d error lines naming poison-2; want 1:\n%s", errorLines, logs.String())
	}
	// Nothing was lost: once the transport takes it, requeuing the row
	// delivers the dead letter.
	accept.Store(true)
	if n, err := b.OutboxStore().Requeue(ctx, []int64{row.ID}); err != nil || n != 1 {
		t.Fatalf("Requeue: %d %v", n, err)
	}
	b.WakeRelay()
	dl := dls.next(t, 10*time.Second, "the requeued dead letter")
	if dl.MessageID != "poison-2" || dl.Headers[bus.HeaderFaultHeadersDropped] == "" {
		t.Errorf("dead letter %q headers %v", dl.MessageID, dl.Headers)
	}
}

// badConnAcker makes the framework's own ack-in-transaction statement fail
// with a connection-class error for one message id, every time, while the
// database answers every probe.
type badConnAcker struct {
	transport.Transport
	id    string
	calls chan struct{}
}

func (a *badConnAcker) AckTx(_ context.Context, msg *message.Message) (bool, error) {
	if msg.UUID != a.id {
		return false, nil
	}
	select {
	case a.calls <- struct{}{}:
	default:
	}
	return false, fmt.Errorf("ack: %w", driver.ErrBadConn)
}

func (a *badConnAcker) AckedInTx(*message.Message) {}

// TestRepeatedConnectionFailuresWhileDatabaseAnswersAreCharged: a delivery
// whose framework statement keeps failing with a connection-class error
// while probes of the database succeed closes the database gate at most
// maxOutagesPerDelivery (10) times; the next failure is charged to it
// (retry policy, then the dead letter), so it does not loop forever. The
// neighbour is consumed.
func TestRepeatedConnectionFailuresWhileDatabaseAnswersAreCharged(t *testing.T) {
	t.Parallel()
	const name = "conn-fail-charged"
	dls := newDeadLetters()
	good := make(chan string, 32)
	acker := &badConnAcker{id: "badconn-1", calls: make(chan struct{}, 1)}
	f := wrapFactory{
		Transport: inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint(name, func(e *endpoint.Endpoint) {
				e.Retry = endpoint.NoRetry()
				e.ConcurrentMessageLimit = 2
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
					good <- c.MessageID
					return nil
				})
			})
			c.ReceiveEndpoint(name+"_error", dls.consumer)
		}),
		wrap: func(tr transport.Transport) transport.Transport { acker.Transport = tr; return acker },
	}
	b := start(t, quiet(), bus.WithTransport(f))
	ctx := context.Background()
	began := time.Now()
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "p"}, bus.Headers{bus.HeaderMessageID: "badconn-1"}); err != nil {
		t.Fatal(err)
	}
	<-acker.calls
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "n"}, bus.Headers{bus.HeaderMessageID: "neighbour-3"}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	deadline := time.After(30 * time.Second)
	var dl *endpoint.Delivery
	for dl == nil || seen["neighbour-3"] == 0 {
		select {
		case id := <-good:
			seen[id]++
		case dl = <-dls.ch:
		case <-deadline:
			t.Fatalf("30s after publishing: dead letter %v, consumed %v; want the delivery charged after 10 outages", dl != nil, seen)
		}
	}
	took := time.Since(began)
	// The consumer ran (and its work rolled back) on each of the 11 attempts.
	if seen["badconn-1"] != 11 {
		t.Errorf("the failing delivery's consumer ran %d times; want 11 (10 outages, then charged)", seen["badconn-1"])
	}
	if got := dl.Headers[bus.HeaderFaultAttempts]; got != "11" {
		t.Errorf("%s = %s; want 11", bus.HeaderFaultAttempts, got)
	}
	if r := dl.Headers[bus.HeaderFaultReason]; !strings.Contains(r, "database failure of this delivery while the database answered probes") {
		t.Errorf("%s = %q; want the charged connection failure", bus.HeaderFaultReason, r)
	}
	waitFor(t, func() bool { return b.Stats().DeadLettered == 1 }) // counted when its handling ends, after the dead letter went
	if s := b.Stats(); s.Requeued != 0 {
		t.Errorf("stats %+v", s)
	}
	t.Logf("charged and dead-lettered %v after publishing", took)
}

// TestRabbitDeadLetterOverflowingTheFrameSentWithoutItsHeaders: the
// defect as it happened on RabbitMQ. A message published by a plain AMQP
// client with headers that fit one frame fails permanently with a 4 KiB
// reason; its dead letter, with the fault headers added, no longer fits
// (the transport refuses it before writing a frame, outbox.ErrUndeliverable),
// so it goes without the received headers at the next try. Before, it was
// retried every ≤ 10 s until the bus stopped.
func TestRabbitDeadLetterOverflowingTheFrameSentWithoutItsHeaders(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("PaymentReceived")
	q := env.q("dl-overflow")
	dls := newDeadLetters()
	good := make(chan string, 4)
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 2
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				if c.Message.PaymentID == "poison" {
					return endpoint.Permanent(errors.New(strings.Repeat("e", 4000)))
				}
				good <- c.MessageID
				return nil
			}, endpoint.AsMessageType(typ))
		})
		c.ReceiveEndpoint(q+"_error", dls.consumer)
	})...)
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	began := time.Now()
	for _, p := range []struct {
		id, payment string
		headers     amqp.Table
	}{
		{"overflow-" + env.suffix, "poison", amqp.Table{"x-big": strings.Repeat("h", 128_000)}},
		{"neighbour-" + env.suffix, "neighbour", nil},
	} {
		body := fmt.Sprintf(`{"PaymentID":%q,"Amount":1}`, p.payment)
		if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
			MessageId: p.id, Type: typ, ContentType: "application/json", Body: []byte(body), Headers: p.headers, DeliveryMode: amqp.Persistent,
		}); err != nil {
			t.Fatal(err)
		}
	}
	if id := receive(t, good, 10*time.Second, "neighbour"); id != "neighbour-"+env.suffix {
		t.Fatalf("consumed %q", id)
	}
	dl := dls.next(t, 15*time.Second, "a dead letter overflowing the frame")
	took := time.Since(began)
	if dl.MessageID != "overflow-"+env.suffix || dl.MessageType != typ {
		t.Errorf("dead letter id %q type %q", dl.MessageID, dl.MessageType)
	}
	if _, ok := dl.Headers["x-big"]; ok {
		t.Error("the dead letter still carries x-big")
	}
	if d := dl.Headers[bus.HeaderFaultHeadersDropped]; !strings.Contains(d, "cannot be delivered as it is") {
		t.Errorf("%s = %q; want the transport's refusal", bus.HeaderFaultHeadersDropped, d)
	}
	if r := dl.Headers[bus.HeaderFaultReason]; !strings.Contains(r, "eeee") {
		t.Errorf("%s = %.80q; want the consumer's error", bus.HeaderFaultReason, r)
	}
	waitFor(t, func() bool { return b.Stats().DeadLettered == 1 })
	if s := b.Stats(); s.DeadLettersReduced != 1 || s.Requeued != 0 {
		t.Errorf("stats %+v", s)
	}
	t.Logf("dead-lettered without its headers %v after publishing", took)
}
