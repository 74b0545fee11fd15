package bus_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
)

// signalHandler closes ch at the first record whose message contains text.
type signalHandler struct {
	text string
	ch   chan struct{}
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.text) {
		select {
		case <-h.ch:
		default:
			close(h.ch)
		}
	}
	return nil
}
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }

// A consumer that publishes while Stop waits for it used to block on the
// lock Stop holds (to wake the relay), and Stop then waited forever for the
// transport's subscription behind it.
func TestStopWhileAConsumerPublishes(t *testing.T) {
	t.Parallel()
	stopping := &signalHandler{text: "Closing router", ch: make(chan struct{})}
	inside := make(chan struct{})
	b, err := bus.New(bus.WithLogger(slog.New(stopping)), bus.WithStopTimeout(time.Second),
		inprocEndpoint("publisher", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ping]) error {
				close(inside)
				<-stopping.ch
				return c.Publish(ctx, pong{}, nil)
			})
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, ping{}, nil); err != nil {
		t.Fatal(err)
	}
	<-inside
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(ctx) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not return")
	}
}

type ping struct{}
type pong struct{}
