package rabbitmq

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/tcpproxy"
	"github.com/barewire-go/barewire/outbox"
)

// TestEveryWaitBoundedWhileTheBrokerStopsReading: a broker in a resource
// alarm stops reading from a publishing connection but keeps sending it
// heartbeats, so nothing on the client's side times out by itself: a
// publish blocks in its socket write once the buffers fill, a channel open
// waits for a reply that never comes, and a close waits for its close-ok.
// The proxy blocks the client's bytes the same way (heartbeats negotiated
// at ten minutes, so that neither side's heartbeat check ends the
// connection first). Every Deliver must still return within
// PublishTimeout and a margin, with its messages failed, a Deliver beside
// it must not queue behind it, and Close must return, ending a running
// subscription's consumer too.
func TestEveryWaitBoundedWhileTheBrokerStopsReading(t *testing.T) {
	// Big: the first Deliver's writes fill the buffers and block.
	// Small: every write fits in the buffers; the waits are for confirms,
	// for the channel opens and closes that follow, and for Close.
	for _, size := range []int{256 << 10, 10} {
		t.Run(map[bool]string{true: "Big", false: "Small"}[size > 10], func(t *testing.T) { testBlockedBroker(t, size) })
	}
}

func testBlockedBroker(t *testing.T, size int) {
	proxy, url, err := tcpproxy.ForURL(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	url += sep + "heartbeat=600"
	const publishTimeout = 2 * time.Second
	const margin = 6 * time.Second
	tr, err := open(url, &Config{PublishTimeout: publishTimeout, ReconnectMaxInterval: time.Second, ConnectTimeout: 5 * time.Second}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = tr.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A subscription too, so that Close has a consumer's channel to end.
	sub := uniq("blocked-sub")
	if err := tr.Start(ctx, []*endpoint.Endpoint{newEndpoint(t, sub, nil, nil)}); err != nil {
		t.Fatal(err)
	}
	out, err := tr.Subscriber().Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	q := uniq("blocked")
	ch := newPlain(t).ch()
	if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	msg := func(id string, size int) *outbox.Message {
		return &outbox.Message{MessageID: id, Destination: "queue:" + q, MessageType: "T", Payload: []byte(strings.Repeat("x", size))}
	}
	if errs := tr.Deliver(ctx, []*outbox.Message{msg("warm", 10)}); errs[0] != nil {
		t.Fatalf("deliver before the block: %v", errs[0])
	}
	warm := msg("warm-sub", 10)
	warm.Destination = "queue:" + sub
	if errs := tr.Deliver(ctx, []*outbox.Message{warm}); errs[0] != nil {
		t.Fatalf("deliver to the subscription before the block: %v", errs[0])
	}
	receive(t, out, 5*time.Second).Ack() // the consumer runs

	proxy.Block()
	defer proxy.Unblock()
	// Big: enough bytes to fill the client's and the proxy's socket buffers.
	var msgs []*outbox.Message
	for i := range 64 {
		msgs = append(msgs, msg("big-"+string(rune('a'+i%26))+string(rune('a'+i/26)), size))
	}
	deliver := func(msgs []*outbox.Message) chan []error {
		done := make(chan []error, 1)
		go func() { done <- tr.Deliver(context.Background(), msgs) }()
		return done
	}
	first := deliver(msgs)
	time.Sleep(200 * time.Millisecond) // not a synchronisation: the second Deliver may start at any point of the first
	second := deliver([]*outbox.Message{msg("beside", 10)})
	for name, done := range map[string]chan []error{"the first Deliver": first, "a small Deliver beside it": second} {
		select {
		case errs := <-done:
			for i, err := range errs {
				if err == nil {
					t.Errorf("%s: message %d reported delivered through a broker that reads nothing", name, i)
				}
			}
		case <-time.After(publishTimeout + margin):
			t.Fatalf("%s did not return within PublishTimeout %v + %v while the broker reads nothing", name, publishTimeout, margin)
		}
	}
	select {
	case errs := <-deliver([]*outbox.Message{msg("after", 10)}):
		if errs[0] == nil {
			t.Error("a Deliver after the others reported delivered through a broker that reads nothing")
		}
	case <-time.After(publishTimeout + margin):
		t.Fatalf("a Deliver after the others did not return within PublishTimeout %v + %v", publishTimeout, margin)
	}
	closeDone := make(chan error, 1)
	go func() { closeDone <- tr.Close() }()
	closed = true
	select {
	case <-closeDone:
	case <-time.After(margin + 5*time.Second):
		t.Fatal("Close did not return while the broker reads nothing")
	}
}
