package transport_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/transport"
)

func admitAll(done *int) func() (func(), error) {
	return func() (func(), error) { return func() { *done++ }, nil }
}

// TestSubscriptionsLifecycle: each stop cause — the caller's context, the
// subscriber's Close, the transport's context — ends the consumer, closes
// its channel and calls the transport's done exactly once.
func TestSubscriptionsLifecycle(t *testing.T) {
	for _, cause := range []string{"caller", "close", "parent"} {
		t.Run(cause, func(t *testing.T) {
			parent, cancelParent := context.WithCancel(context.Background())
			defer cancelParent()
			subs := transport.NewSubscriptions(parent, "test")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := 0
			started := make(chan struct{})
			out, err := subs.Start(ctx, "q", admitAll(&done), func(ctx context.Context, out chan<- *message.Message) {
				out <- message.NewMessage("1", nil)
				close(started)
				<-ctx.Done()
			})
			if err != nil {
				t.Fatal(err)
			}
			if m := <-out; m.UUID != "1" {
				t.Fatalf("got %q", m.UUID)
			}
			<-started
			switch cause {
			case "caller":
				cancel()
			case "close":
				_ = subs.Close()
			case "parent":
				cancelParent()
			}
			if _, ok := <-out; ok {
				t.Fatal("channel still open after the consumer stopped")
			}
			_ = subs.Close() // waits for the goroutine
			if done != 1 {
				t.Fatalf("done called %d times, want 1", done)
			}
		})
	}
}

func TestSubscriptionsRefusals(t *testing.T) {
	subs := transport.NewSubscriptions(context.Background(), "test")
	run := func(context.Context, chan<- *message.Message) { t.Error("run must not be called") }
	n := 0
	if _, err := subs.Start(context.Background(), "", admitAll(&n), run); err == nil || !strings.Contains(err.Error(), "empty queue name") {
		t.Errorf("empty queue: %v", err)
	}
	refused := errors.New("transport closed")
	if _, err := subs.Start(context.Background(), "q", func() (func(), error) { return nil, refused }, run); !errors.Is(err, refused) {
		t.Errorf("admit refusal: %v", err)
	}
	_ = subs.Close()
	if _, err := subs.Start(context.Background(), "q", admitAll(&n), run); err == nil || !strings.Contains(err.Error(), "subscriber is closed") {
		t.Errorf("after Close: %v", err)
	}
	if n != 0 {
		t.Errorf("admitted %d consumers that never ran", n)
	}
}
