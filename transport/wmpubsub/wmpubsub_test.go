package wmpubsub_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

func build(f transport.Factory) (transport.Transport, error) {
	return f.Build(transport.Env{Logger: slog.New(slog.DiscardHandler), RelayLease: time.Minute})
}

func TestBuildRefusesMissingPubSubAndBrokerSettings(t *testing.T) {
	_, err := build(wmpubsub.New(func(c *wmpubsub.Config) {
		c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil })
			e.Bind("audit", "key")
		})
	}))
	if err == nil {
		t.Fatal("Build accepted a config without publisher or subscriber")
	}
	for _, want := range []string{"Config.Publisher is nil", "Config.Subscriber is nil", "routing key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Build error %q does not mention %q", err, want)
		}
	}
}

func TestToMessageCarriesIdTypeAndHeaders(t *testing.T) {
	m := wmpubsub.ToMessage(&outbox.Message{
		MessageID: "id-1", MessageType: "T", ContentType: "application/json", CorrelationID: "c",
		Destination: "exchange:T", Payload: []byte("{}"),
		Headers: map[string]string{"x": "y", wire.HeaderWatermillUUID: "spoofed"},
	})
	if m.UUID != "id-1" || string(m.Payload) != "{}" {
		t.Fatalf("message %q %q", m.UUID, m.Payload)
	}
	for k, v := range map[string]string{
		wire.HeaderMessageType: "T", wire.HeaderContentType: "application/json", wire.HeaderCorrelationID: "c",
		wire.HeaderDestination: "exchange:T", "x": "y", wire.HeaderMessageID: "id-1",
	} {
		if g := m.Metadata.Get(k); g != v {
			t.Errorf("%s = %q, want %q", k, g, v)
		}
	}
	if _, ok := m.Metadata[wire.HeaderWatermillUUID]; ok {
		t.Error("metadata keeps _watermill_message_uuid, which the stock marshalers own")
	}
}

type failingPub struct{}

func (failingPub) Publish(string, ...*message.Message) error { return errors.New("boom") }
func (failingPub) Close() error                              { return nil }

type nopSub struct{}

func (nopSub) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return make(chan *message.Message), nil
}
func (nopSub) Close() error { return nil }

// TestPublishErrorChargedToConnectionOnlyWhileUnhealthy: a publish error is
// the message's own while Health is nil, and the connection's (retried by
// the relay uncounted) while Health fails.
func TestPublishErrorChargedToConnectionOnlyWhileUnhealthy(t *testing.T) {
	var healthErr error
	tr, err := build(wmpubsub.New(func(c *wmpubsub.Config) {
		c.Publisher = func(context.Context) (message.Publisher, error) { return failingPub{}, nil }
		c.Subscriber = func(context.Context, string) (message.Subscriber, error) { return nopSub{}, nil }
		c.Health = func(context.Context) error { return healthErr }
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	if err := tr.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	msg := []*outbox.Message{{MessageID: "m", MessageType: "T", Destination: "exchange:T"}}
	if err := tr.Deliver(ctx, msg)[0]; err == nil || errors.Is(err, outbox.ErrTransportUnavailable) {
		t.Errorf("healthy: %v, want the message's own error", err)
	}
	healthErr = errors.New("down")
	if err := tr.Deliver(ctx, msg)[0]; !errors.Is(err, outbox.ErrTransportUnavailable) {
		t.Errorf("unhealthy: %v, want ErrTransportUnavailable", err)
	}
}

// flakySub fails its first Subscribe and ends its second subscription at
// once; the third stays.
type flakySub struct {
	calls chan int
	n     int
	msgs  chan *message.Message
}

func (s *flakySub) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	s.n++
	s.calls <- s.n
	switch s.n {
	case 1:
		return nil, errors.New("server unreachable")
	case 2:
		ch := make(chan *message.Message)
		close(ch)
		return ch, nil
	}
	// Like a real subscriber: the channel closes once ctx is done.
	ch := make(chan *message.Message)
	go func() {
		defer close(ch)
		for {
			select {
			case m := <-s.msgs:
				select {
				case ch <- m:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}
func (s *flakySub) Close() error { return nil }

// TestSubscriptionRetriedUntilItHolds: a topic whose subscription fails,
// or ends on its own, is subscribed again, and its messages then flow.
func TestSubscriptionRetriedUntilItHolds(t *testing.T) {
	sub := &flakySub{calls: make(chan int, 8), msgs: make(chan *message.Message, 1)}
	tr, err := build(wmpubsub.New(func(c *wmpubsub.Config) {
		c.Publisher = func(context.Context) (message.Publisher, error) { return failingPub{}, nil }
		c.Subscriber = func(context.Context, string) (message.Subscriber, error) { return sub, nil }
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := tr.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	out, err := tr.Subscriber().Subscribe(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	sub.msgs <- message.NewMessage("m1", []byte("x"))
	select {
	case m := <-out:
		if m.UUID != "m1" {
			t.Fatalf("got %q", m.UUID)
		}
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("no message after the subscription failed and ended: not subscribed again")
	}
	if n := len(sub.calls); n != 3 {
		t.Errorf("Subscribe called %d times, want 3", n)
	}
}

// initSub is a subscriber that records its topic initializations and
// whether it was closed; its subscriptions end with their context.
type initSub struct {
	inits  chan string
	closed chan struct{}
}

func (s *initSub) SubscribeInitialize(topic string) error { s.inits <- topic; return nil }
func (s *initSub) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	ch := make(chan *message.Message)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}
func (s *initSub) Close() error { close(s.closed); return nil }

type nopPub struct{}

func (nopPub) Publish(string, ...*message.Message) error { return nil }
func (nopPub) Close() error                              { return nil }

// TestReplyQueueDeclaredInitializedAndReleased: DeclareReplyQueue refuses
// before Start, opens the queue's subscriber once and initializes its topic
// (so nothing sent before the first Subscribe is lost), and is idempotent;
// DeleteReplyQueue ends a subscription still running and closes the
// subscriber.
func TestReplyQueueDeclaredInitializedAndReleased(t *testing.T) {
	sub := &initSub{inits: make(chan string, 10), closed: make(chan struct{})}
	var opened []string
	tr, err := build(wmpubsub.New(func(c *wmpubsub.Config) {
		c.Publisher = func(context.Context) (message.Publisher, error) { return nopPub{}, nil }
		c.Subscriber = func(_ context.Context, q string) (message.Subscriber, error) {
			opened = append(opened, q)
			return sub, nil
		}
		c.Topics.Queue = func(q string) string { return "q." + q }
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	rq, ok := tr.(transport.ReplyQueues)
	if !ok {
		t.Fatal("wmpubsub.Transport does not implement transport.ReplyQueues")
	}
	ctx := context.Background()
	if err := rq.DeclareReplyQueue(ctx, "r1"); !errors.Is(err, outbox.ErrTransportUnavailable) {
		t.Fatalf("DeclareReplyQueue before Start: %v, want ErrTransportUnavailable", err)
	}
	if err := tr.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := rq.DeclareReplyQueue(ctx, "r1"); err != nil {
			t.Fatalf("DeclareReplyQueue: %v", err)
		}
	}
	if len(opened) != 1 || opened[0] != "r1" {
		t.Fatalf("subscribers opened for %q, want one for r1", opened)
	}
	if got := <-sub.inits; got != "q.r1" {
		t.Fatalf("initialized topic %q, want q.r1", got)
	}
	if len(sub.inits) != 0 {
		t.Fatalf("the topic was initialized again by the second declaration")
	}
	ch, err := tr.Subscriber().Subscribe(ctx, "r1") // never canceled by the caller
	if err != nil {
		t.Fatal(err)
	}
	if err := rq.DeleteReplyQueue(ctx, "r1"); err != nil {
		t.Fatalf("DeleteReplyQueue: %v", err)
	}
	select {
	case _, open := <-ch:
		if open {
			t.Fatal("a message from a deleted reply queue")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reply queue's subscription still runs after DeleteReplyQueue")
	}
	select {
	case <-sub.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("DeleteReplyQueue did not close the queue's subscriber")
	}
	if err := rq.DeleteReplyQueue(ctx, "r1"); err != nil {
		t.Fatalf("DeleteReplyQueue again: %v", err)
	}
}

// stuckPub never answers until released, as watermill-amqp waiting for a
// confirm from a broker in a resource alarm.
type stuckPub struct{ release chan struct{} }

func (p stuckPub) Publish(string, ...*message.Message) error { <-p.release; return nil }
func (p stuckPub) Close() error                              { return nil }

// TestPublishTimeoutBoundsEveryPublish: Config.PublishTimeout bounds a
// publish the Pub/Sub never answers ("transport unavailable", uncounted
// by the relay); a negative one is refused at Build; after
// maxStuckPublishes calls are left waiting, Deliver fails at once.
func TestPublishTimeoutBoundsEveryPublish(t *testing.T) {
	if _, err := build(wmpubsub.New(func(c *wmpubsub.Config) {
		c.Publisher = func(context.Context) (message.Publisher, error) { return stuckPub{}, nil }
		c.Subscriber = func(context.Context, string) (message.Subscriber, error) { return nopSub{}, nil }
		c.PublishTimeout = -time.Second
	})); err == nil || !strings.Contains(err.Error(), "PublishTimeout") {
		t.Errorf("a negative PublishTimeout: %v, want an error naming it", err)
	}
	release := make(chan struct{})
	defer close(release)
	tr, err := build(wmpubsub.New(func(c *wmpubsub.Config) {
		c.Publisher = func(context.Context) (message.Publisher, error) { return stuckPub{release}, nil }
		c.Subscriber = func(context.Context, string) (message.Subscriber, error) { return nopSub{}, nil }
		c.PublishTimeout = 100 * time.Millisecond
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := tr.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	msgs := make([]*outbox.Message, 20)
	for i := range msgs {
		msgs[i] = &outbox.Message{MessageID: fmt.Sprint("m", i), MessageType: "T", Destination: "exchange:T"}
	}
	began := time.Now()
	errs := tr.Deliver(ctx, msgs)
	took := time.Since(began)
	for i, err := range errs {
		if !errors.Is(err, outbox.ErrTransportUnavailable) {
			t.Errorf("message %d: %v, want ErrTransportUnavailable", i, err)
		}
	}
	// 16 publishes wait 100ms each; the 4 after them fail at once.
	if took > 16*100*time.Millisecond+time.Second {
		t.Errorf("20 stuck publishes took %v with a 100ms PublishTimeout", took)
	}
	if !strings.Contains(errs[19].Error(), "still wait") {
		t.Errorf("the 20th publish: %v, want it refused at once while 16 calls still wait", errs[19])
	}
}
