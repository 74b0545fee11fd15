// Package transporttest is the conformance suite of the transport seam:
// every transport runs it against its real broker. Call Run from a test of
// the transport's package with a Config that builds the transport:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, transporttest.Config{
//			New: func(t *testing.T, declare func(*endpoint.Endpoints)) transport.Factory {
//				return inproc.New(func(c *inproc.Config) { declare(&c.Endpoints) })
//			},
//		})
//	}
//
// The suite checks what the bus relies on: a round trip keeps the id, the
// type, the content type, the correlation id, every header and the exact
// bytes of the body; a message sent to an exchange reaches every endpoint
// that consumes its type (fan-out) and one consumer of each (competing
// consumers); an acked message is gone, a nacked one comes back flagged
// redelivered without holding up the messages behind it; an endpoint's
// error queue receives dead letters intact; a transport that loses its
// connection re-declares its topology and keeps delivering; and Close
// with a delivery in flight returns, and loses nothing on a durable
// transport. A transport that implements transport.ReplyQueues gets a
// reply queue that receives sends, survives a reconnect, and after its
// deletion makes a send fail as unroutable (or write nothing), never wait.
//
// Like package transport, this API may still change.
package transporttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// Config says how to build the transport under test.
type Config struct {
	// New returns a factory for a fresh transport whose receive endpoints
	// declare declares. The names the suite declares are unique per run;
	// New is called again with the same names when a subtest needs a
	// second instance on the same broker (Durable).
	New func(t *testing.T, declare func(e *endpoint.Endpoints)) transport.Factory
	// Durable says that messages outlive a transport instance (a broker,
	// a database): a delivery unacknowledged at Close is delivered again
	// to the next instance. False for the in-process transport.
	Durable bool
	// Reconnect, when set, makes tr lose its connection as a network
	// failure would (for instance through transport.ConnDropper) and
	// returns once it is lost. Without it the reconnect case is skipped.
	Reconnect func(t *testing.T, tr transport.Transport)
	// DeleteQueue, when set, deletes a queue behind the transport's back
	// (for instance with a plain client). With Reconnect, the suite checks
	// that the endpoint's queue is declared again after the reconnect.
	DeleteQueue func(t *testing.T, queue string)
	// NackGoesBehind says that a nacked message waits behind the
	// messages queued after it, or for a delay, so that one message
	// nacked over and over cannot hold up its neighbours (in-process:
	// requeued at the tail; PostgreSQL: RedeliveryDelay). False for
	// RabbitMQ, which puts a requeued message back at its position at the
	// head. The bus never relies on it for failures: retries run in
	// process, redeliveries wait as outbox rows, and dead letters go to
	// the error queue.
	NackGoesBehind bool
	// Cleanup, when set, is called at the end of each subtest, after the
	// transport closed, with the queues (endpoint and error queues) and
	// the exchanges (one per message type) it declared, to delete them.
	Cleanup func(t *testing.T, queues, exchanges []string)
	// Timeout bounds each wait for a message. Defaults to 10s.
	Timeout time.Duration
}

// Run runs every conformance case as a subtest of t.
func Run(t *testing.T, c Config) {
	if c.New == nil {
		t.Fatal("transporttest: Config.New is nil")
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	s := &suite{c: c}
	t.Run("RoundTripKeepsEverything", s.roundTrip)
	t.Run("ExchangeFansOutToEveryConsumingEndpoint", s.fanOut)
	t.Run("CompetingConsumersShareAQueue", s.competing)
	t.Run("AckRemovesNackRedelivers", s.ackNack)
	t.Run("NackedMessageDoesNotBlockItsNeighbours", s.nackDoesNotBlock)
	t.Run("ErrorQueueReceivesDeadLetters", s.deadLetter)
	t.Run("TopologyRedeclaredAfterReconnect", s.reconnect)
	t.Run("CloseMidDelivery", s.closeMidDelivery)
	t.Run("ReplyQueue", s.replyQueue)
}

type suite struct{ c Config }

// fixture is one subtest's names and running transport.
type fixture struct {
	s      *suite
	t      *testing.T
	prefix string
	// endpoints: name → consumed message types.
	endpoints map[string][]string
	tr        transport.Transport
	eps       []*endpoint.Endpoint
	sub       message.Subscriber

	mu   sync.Mutex
	seen []*message.Message // every message handed out, settled at cleanup
}

type probe struct{}

func newFixture(t *testing.T, s *suite, endpoints map[string][]string) *fixture {
	var b [4]byte
	_, _ = rand.Read(b[:])
	f := &fixture{s: s, t: t, prefix: "tt" + hex.EncodeToString(b[:]), endpoints: map[string][]string{}}
	for name, types := range endpoints {
		full := f.prefix + "." + name
		var ts []string
		for _, ty := range types {
			ts = append(ts, f.prefix+"."+ty)
		}
		f.endpoints[full] = ts
	}
	if s.c.Cleanup != nil {
		t.Cleanup(func() {
			var qs, xs []string
			for name, types := range f.endpoints {
				qs = append(qs, name, name+"_error")
				xs = append(xs, types...)
			}
			slices.Sort(qs)
			slices.Sort(xs)
			s.c.Cleanup(t, qs, slices.Compact(xs))
		})
	}
	return f
}

// name returns the full name of one of the fixture's endpoints or types.
func (f *fixture) name(short string) string { return f.prefix + "." + short }

// start builds and starts a transport with the fixture's endpoints.
func (f *fixture) start() transport.Transport {
	f.t.Helper()
	fac := f.s.c.New(f.t, func(e *endpoint.Endpoints) {
		names := make([]string, 0, len(f.endpoints))
		for n := range f.endpoints {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			types := f.endpoints[n]
			e.ReceiveEndpoint(n, func(ep *endpoint.Endpoint) {
				for _, ty := range types {
					endpoint.Consumer(ep, func(context.Context, *endpoint.Context[probe]) error { return nil }, endpoint.AsMessageType(ty))
				}
				if len(types) == 0 {
					endpoint.RawConsumer(ep, func(context.Context, *endpoint.Delivery) error { return nil })
				}
			})
		}
	})
	if fac == nil {
		f.t.Fatal("transporttest: Config.New returned nil")
	}
	eps := fac.Endpoints()
	if errs := eps.Errs(); len(errs) > 0 {
		f.t.Fatalf("endpoint declarations: %v", errs)
	}
	tr, err := fac.Build(transport.Env{Logger: slog.New(slog.DiscardHandler), RelayLease: time.Minute})
	if err != nil {
		f.t.Fatalf("Build: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.Start(ctx, eps.List()); err != nil {
		_ = tr.Close()
		f.t.Fatalf("Start: %v", err)
	}
	if err := tr.Health(ctx); err != nil {
		_ = tr.Close()
		f.t.Fatalf("Health after Start: %v", err)
	}
	f.tr, f.eps, f.sub = tr, eps.List(), tr.Subscriber()
	f.t.Cleanup(func() {
		// A failed check may leave a delivery unsettled; a transport may
		// wait for its verdict before it closes.
		f.mu.Lock()
		for _, m := range f.seen {
			m.Nack()
		}
		f.mu.Unlock()
		_ = tr.Close()
	})
	return tr
}

// subscribe starts one consumer of queue, stopped at the end of the test.
func (f *fixture) subscribe(queue string) <-chan *message.Message {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	ch, err := f.sub.Subscribe(ctx, queue)
	if err != nil {
		f.t.Fatalf("Subscribe(%q): %v", queue, err)
	}
	return ch
}

func (f *fixture) deliver(msgs ...*outbox.Message) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), f.s.c.Timeout)
	defer cancel()
	for i, err := range f.tr.Deliver(ctx, msgs) {
		if err != nil {
			f.t.Fatalf("Deliver %q to %s: %v", msgs[i].MessageID, msgs[i].Destination, err)
		}
	}
}

// next waits for one message on ch.
func (f *fixture) next(ch <-chan *message.Message, what string) *message.Message {
	f.t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			f.t.Fatalf("%s: subscription closed", what)
		}
		f.track(m)
		return m
	case <-time.After(f.s.c.Timeout):
		f.t.Fatalf("%s: no message within %v", what, f.s.c.Timeout)
	}
	return nil
}

func (f *fixture) track(m *message.Message) {
	f.mu.Lock()
	f.seen = append(f.seen, m)
	f.mu.Unlock()
}

func (f *fixture) msg(id, dest string) *outbox.Message {
	return &outbox.Message{
		MessageID:   f.prefix + "-" + id,
		MessageType: f.name("Probe"),
		ContentType: "application/json",
		Payload:     []byte(`{"id":"` + id + `"}`),
		Destination: dest,
		Headers:     map[string]string{},
	}
}

func (s *suite) roundTrip(t *testing.T) {
	f := newFixture(t, s, map[string][]string{"rt": {"Probe"}})
	f.start()
	ch := f.subscribe(f.name("rt"))
	body := make([]byte, 256)
	for i := range body {
		body[i] = byte(i)
	}
	want := &outbox.Message{
		MessageID:     f.prefix + "-rt-ü/1",
		MessageType:   f.name("Probe"),
		ContentType:   "application/octet-stream",
		CorrelationID: "corr-" + f.prefix,
		Payload:       body,
		Destination:   wire.QueuePrefix + f.name("rt"),
		Headers: map[string]string{
			"x-plain":   "v",
			"x-unicode": "ünïcødé ✓",
			"x-spaces":  "  padded  ",
			"x-json":    `{"a":[1,2]}`,
			"x-long":    strings.Repeat("L", 4096),
		},
	}
	byExchange := *want
	byExchange.MessageID = f.prefix + "-rt-2"
	byExchange.Destination = wire.ExchangePrefix + f.name("Probe")
	byExchange.Headers = map[string]string{"x-plain": "by exchange"}
	f.deliver(want)
	f.deliver(&byExchange)
	got := map[string]*message.Message{}
	for range 2 {
		m := f.next(ch, "round trip")
		got[m.UUID] = m
		if !m.Ack() {
			t.Errorf("Ack of %q refused", m.UUID)
		}
	}
	for _, w := range []*outbox.Message{want, &byExchange} {
		m := got[w.MessageID]
		if m == nil {
			t.Errorf("message %q not received by id (got ids %v)", w.MessageID, keys(got))
			continue
		}
		if string(m.Payload) != string(w.Payload) {
			t.Errorf("%q: payload %q, want %q", w.MessageID, m.Payload, w.Payload)
		}
		for k, v := range map[string]string{
			wire.HeaderMessageType:   w.MessageType,
			wire.HeaderContentType:   w.ContentType,
			wire.HeaderCorrelationID: w.CorrelationID,
		} {
			if g := m.Metadata.Get(k); g != v {
				t.Errorf("%q: %s = %q, want %q", w.MessageID, k, g, v)
			}
		}
		for k, v := range w.Headers {
			if g := m.Metadata.Get(k); g != v {
				t.Errorf("%q: header %s = %q, want %q", w.MessageID, k, trim(g), trim(v))
			}
		}
		if r := m.Metadata.Get(transport.MetaRedelivered); r == "true" {
			t.Errorf("%q: first delivery flagged redelivered", w.MessageID)
		}
	}
}

func (s *suite) fanOut(t *testing.T) {
	f := newFixture(t, s, map[string][]string{"a": {"Probe"}, "b": {"Probe", "Other"}, "c": {"Other"}})
	f.start()
	a, b, c := f.subscribe(f.name("a")), f.subscribe(f.name("b")), f.subscribe(f.name("c"))
	f.deliver(f.msg("fan", wire.ExchangePrefix+f.name("Probe")))
	for name, ch := range map[string]<-chan *message.Message{"a": a, "b": b} {
		m := f.next(ch, "fan-out to "+name)
		if m.UUID != f.prefix+"-fan" {
			t.Errorf("endpoint %s got %q", name, m.UUID)
		}
		m.Ack()
	}
	// c consumes Other only: the next message it sees must be the one
	// sent to Other, not the Probe.
	other := f.msg("other", wire.ExchangePrefix+f.name("Other"))
	other.MessageType = f.name("Other")
	f.deliver(other)
	if m := f.next(c, "endpoint c"); m.UUID != other.MessageID {
		t.Errorf("endpoint c (consumes Other only) got %q first, want %q", m.UUID, other.MessageID)
	} else {
		m.Ack()
	}
	if m := f.next(b, "endpoint b, Other"); m.UUID != other.MessageID {
		t.Errorf("endpoint b got %q, want %q", m.UUID, other.MessageID)
	} else {
		m.Ack()
	}
}

func (s *suite) competing(t *testing.T) {
	f := newFixture(t, s, map[string][]string{"cc": {"Probe"}})
	f.start()
	const n = 40
	var mu sync.Mutex
	seen := map[string]int{}
	done := make(chan struct{})
	var once sync.Once
	consume := func(ch <-chan *message.Message) {
		for m := range ch {
			f.track(m)
			mu.Lock()
			seen[m.UUID]++
			total := 0
			for _, c := range seen {
				total += c
			}
			mu.Unlock()
			m.Ack()
			if total >= n {
				once.Do(func() { close(done) })
			}
		}
	}
	go consume(f.subscribe(f.name("cc")))
	go consume(f.subscribe(f.name("cc")))
	var msgs []*outbox.Message
	for i := range n {
		msgs = append(msgs, f.msg(fmt.Sprintf("cc-%02d", i), wire.ExchangePrefix+f.name("Probe")))
	}
	f.deliver(msgs...)
	select {
	case <-done:
	case <-time.After(s.c.Timeout):
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range msgs {
		if seen[m.MessageID] != 1 {
			t.Errorf("%q delivered %d times to two competing consumers, want once", m.MessageID, seen[m.MessageID])
		}
	}
}

func (s *suite) ackNack(t *testing.T) {
	f := newFixture(t, s, map[string][]string{"an": {"Probe"}})
	f.start()
	ch := f.subscribe(f.name("an"))
	first := f.msg("nacked", wire.QueuePrefix+f.name("an"))
	f.deliver(first)
	m := f.next(ch, "first delivery")
	if m.UUID != first.MessageID {
		t.Fatalf("got %q, want %q", m.UUID, first.MessageID)
	}
	m.Nack()
	again := f.next(ch, "redelivery after nack")
	if again.UUID != first.MessageID || string(again.Payload) != string(first.Payload) {
		t.Fatalf("after nack got %q %q, want the same message", again.UUID, again.Payload)
	}
	if again.Metadata.Get(transport.MetaRedelivered) != "true" {
		t.Errorf("redelivery not flagged: %s = %q", transport.MetaRedelivered, again.Metadata.Get(transport.MetaRedelivered))
	}
	again.Ack()
	// Acked means gone: the next message on the queue is a new one.
	marker := f.msg("marker", wire.QueuePrefix+f.name("an"))
	f.deliver(marker)
	if m := f.next(ch, "after ack"); m.UUID != marker.MessageID {
		t.Errorf("after ack got %q, want the marker %q (an acked message came back)", m.UUID, marker.MessageID)
	} else {
		m.Ack()
	}
}

func (s *suite) nackDoesNotBlock(t *testing.T) {
	if !s.c.NackGoesBehind {
		t.Skip("the transport requeues a nacked message at the head (Config.NackGoesBehind is false)")
	}
	f := newFixture(t, s, map[string][]string{"nb": {"Probe"}})
	f.start()
	ch := f.subscribe(f.name("nb"))
	poison := f.msg("poison", wire.QueuePrefix+f.name("nb"))
	f.deliver(poison)
	if m := f.next(ch, "poison"); m.UUID != poison.MessageID {
		t.Fatalf("got %q first", m.UUID)
	} else {
		// Handed back before its neighbours exist, then again each time.
		m.Nack()
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, f.prefix+fmt.Sprintf("-n%d", i))
		f.deliver(f.msg(fmt.Sprintf("n%d", i), wire.QueuePrefix+f.name("nb")))
	}
	got := map[string]bool{}
	deadline := time.Now().Add(s.c.Timeout)
	for len(got) < len(ids) && time.Now().Before(deadline) {
		m := f.next(ch, "neighbours of a nacked message")
		if m.UUID == poison.MessageID {
			m.Nack()
			continue
		}
		got[m.UUID] = true
		m.Ack()
	}
	for _, id := range ids {
		if !got[id] {
			t.Errorf("%q not delivered while a message ahead of it kept being nacked", id)
		}
	}
}

func (s *suite) deadLetter(t *testing.T) {
	f := newFixture(t, s, map[string][]string{"dl": {"Probe"}})
	f.start()
	errQ := f.name("dl") + "_error"
	for _, ep := range f.eps {
		if ep.Name() == f.name("dl") && ep.ErrorQueue != errQ {
			t.Fatalf("endpoint's ErrorQueue is %q, want %q", ep.ErrorQueue, errQ)
		}
	}
	ch := f.subscribe(errQ)
	dl := f.msg("dead", wire.QueuePrefix+errQ)
	dl.Headers[wire.HeaderFaultReason] = "consumer failed: reason ✗"
	f.deliver(dl)
	m := f.next(ch, "dead letter in the error queue")
	if m.UUID != dl.MessageID || string(m.Payload) != string(dl.Payload) {
		t.Errorf("error queue got %q %q, want %q %q", m.UUID, m.Payload, dl.MessageID, dl.Payload)
	}
	if g := m.Metadata.Get(wire.HeaderFaultReason); g != dl.Headers[wire.HeaderFaultReason] {
		t.Errorf("fault reason %q, want %q", g, dl.Headers[wire.HeaderFaultReason])
	}
	m.Ack()
}

func (s *suite) reconnect(t *testing.T) {
	if s.c.Reconnect == nil {
		t.Skip("the transport has no connection to lose (Config.Reconnect is nil)")
	}
	f := newFixture(t, s, map[string][]string{"rc": {"Probe"}})
	tr := f.start()
	ch := f.subscribe(f.name("rc"))
	before := f.msg("before", wire.ExchangePrefix+f.name("Probe"))
	f.deliver(before)
	f.next(ch, "before the reconnect").Ack()
	if s.c.DeleteQueue != nil {
		s.c.DeleteQueue(t, f.name("rc"))
	}
	s.c.Reconnect(t, tr)
	after := f.msg("after", wire.ExchangePrefix+f.name("Probe"))
	// The publish may race the re-declaration; Deliver to an exchange
	// with no bound queue succeeds silently, so retry until it arrives.
	deadline := time.Now().Add(s.c.Timeout)
	for {
		// Delivering while disconnected fails as transport unavailable
		// (the relay retries such rows); try again until the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), s.c.Timeout)
		err := tr.Deliver(ctx, []*outbox.Message{after})[0]
		cancel()
		if err != nil && !errors.Is(err, outbox.ErrTransportUnavailable) {
			t.Fatalf("Deliver after the reconnect: %v (want success, or an error wrapping outbox.ErrTransportUnavailable while disconnected)", err)
		}
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatal("subscription closed by the reconnect")
			}
			f.track(m)
			m.Ack()
			if m.UUID == before.MessageID {
				// Its ack may have been in flight when the connection
				// went: a broker redelivers it, as it may.
				continue
			}
			if m.UUID != after.MessageID {
				t.Fatalf("after the reconnect got %q, want %q", m.UUID, after.MessageID)
			}
			return
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message through exchange %q within %v of the reconnect: topology not re-declared or consumer not resumed", f.name("Probe"), s.c.Timeout)
		}
	}
}

func (s *suite) closeMidDelivery(t *testing.T) {
	f := newFixture(t, s, map[string][]string{"cm": {"Probe"}})
	tr := f.start()
	ch := f.subscribe(f.name("cm"))
	held := f.msg("held", wire.QueuePrefix+f.name("cm"))
	f.deliver(held)
	m := f.next(ch, "delivery to hold")
	closed := make(chan error, 1)
	go func() { closed <- tr.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close with a delivery in flight: %v", err)
		}
	case <-time.After(s.c.Timeout):
		t.Fatalf("Close did not return within %v with a delivery in flight", s.c.Timeout)
	}
	m.Ack() // a late verdict must not panic or block
	if !s.c.Durable {
		return
	}
	g := &fixture{s: s, t: t, prefix: f.prefix, endpoints: f.endpoints}
	g.start()
	ch2 := g.subscribe(g.name("cm"))
	// The late ack came after Close: the message was not acknowledged and
	// must come back. (A transport may also have settled it; then it is
	// acceptable only if the ack really reached the broker — not what
	// "Close requeues in-flight deliveries" promises.)
	again := g.next(ch2, "redelivery of the message in flight at Close")
	if again.UUID != held.MessageID {
		t.Errorf("new instance got %q, want %q", again.UUID, held.MessageID)
	}
	again.Ack()
}

func keys(m map[string]*message.Message) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func trim(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func (s *suite) replyQueue(t *testing.T) {
	f := newFixture(t, s, map[string][]string{"rq": {"Probe"}})
	tr := f.start()
	rq, ok := tr.(transport.ReplyQueues)
	if !ok {
		t.Skip("the transport does not implement transport.ReplyQueues")
	}
	name := f.name("reply")
	ctx, cancel := context.WithTimeout(context.Background(), s.c.Timeout)
	defer cancel()
	if err := rq.DeclareReplyQueue(ctx, name); err != nil {
		t.Fatalf("DeclareReplyQueue: %v", err)
	}
	if err := rq.DeclareReplyQueue(ctx, name); err != nil {
		t.Fatalf("DeclareReplyQueue again (must be idempotent): %v", err)
	}
	sctx, stop := context.WithCancel(context.Background())
	defer stop()
	ch, err := f.sub.Subscribe(sctx, name)
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", name, err)
	}
	first := f.msg("reply-1", wire.QueuePrefix+name)
	first.Headers[wire.HeaderRequestID] = "req-1"
	f.deliver(first)
	m := f.next(ch, "a response in the reply queue")
	if m.UUID != first.MessageID || m.Metadata.Get(wire.HeaderRequestID) != "req-1" {
		t.Fatalf("reply queue got %q with request id %q", m.UUID, m.Metadata.Get(wire.HeaderRequestID))
	}
	m.Ack()
	if s.c.Reconnect != nil {
		s.c.Reconnect(t, tr)
		again := f.msg("reply-2", wire.QueuePrefix+name)
		deadline := time.Now().Add(s.c.Timeout)
		for {
			dctx, dcancel := context.WithTimeout(context.Background(), s.c.Timeout)
			err := tr.Deliver(dctx, []*outbox.Message{again})[0]
			dcancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Deliver to the reply queue after the reconnect: %v (not declared again?)", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for {
			m := f.next(ch, "a response after the reconnect")
			m.Ack()
			if m.UUID == again.MessageID {
				break
			}
			if m.UUID != first.MessageID {
				// The first one's ack may have been in flight when the
				// connection went: it may come again, nothing else may.
				t.Fatalf("after the reconnect got %q, want %q", m.UUID, again.MessageID)
			}
		}
	}
	stop()
	for range ch { // the subscription ends before the queue goes
	}
	if err := rq.DeleteReplyQueue(ctx, name); err != nil {
		t.Fatalf("DeleteReplyQueue: %v", err)
	}
	late := f.msg("reply-late", wire.QueuePrefix+name)
	if err := tr.Deliver(ctx, []*outbox.Message{late})[0]; err != nil && !errors.Is(err, transport.ErrUnroutable) {
		t.Fatalf("Deliver to a deleted reply queue: %v, want nil (nothing written) or an error wrapping transport.ErrUnroutable", err)
	}
}
