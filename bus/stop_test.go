package bus_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/rabbitmq"
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

// TestStopWhileAHandlerCallsTheBus (issue 33, item 1): a handler calls
// the bus with a context that carries no transaction while Stop drains it.
// Stop used to hold its lock for the whole drain, and Publish, Send and
// Request take it: on the embedded default Stop never returned, on
// RabbitMQ it ran to its deadline and the handler's call failed with "not
// started". Now the publish completes, a new request fails at once with
// ErrStopping, and Stop returns well within its deadline with the
// handler's message processed.
func TestStopWhileAHandlerCallsTheBus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options func(t *testing.T, declare func(*endpoint.Endpoints)) []bus.Option
		queue   func(t *testing.T) string
	}{
		{"inproc", func(t *testing.T, declare func(*endpoint.Endpoints)) []bus.Option {
			return []bus.Option{inprocEndpoints(declare)}
		}, func(*testing.T) string { return "calls" }},
		{"rabbitmq", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			options, queue := tc.options, "calls"
			if tc.name == "rabbitmq" {
				env := newRealEnv(t)
				queue = env.q("calls")
				options = func(_ *testing.T, declare func(*endpoint.Endpoints)) []bus.Option { return env.options(declare) }
			}
			stopping := &signalHandler{text: "Closing router", ch: make(chan struct{})}
			inside := make(chan struct{})
			calls := make(chan error, 2)
			var committed atomic.Int32
			var b *bus.Bus
			opts := append(options(t, func(c *endpoint.Endpoints) {
				c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) {
					endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ping]) error {
						close(inside)
						<-stopping.ch
						// No transaction in this context: straight to the transport.
						calls <- b.Publish(context.Background(), pong{}, bus.Headers{bus.HeaderMessageID: "during-stop"})
						_, err := bus.Request[pong](context.Background(), b, queue, ping{}, bus.WithRequestTimeout(10*time.Second))
						calls <- err
						return nil
					}, endpoint.AsMessageType("StopCallsPing-"+queue))
				})
			}), bus.WithLogger(slog.New(stopping)), bus.WithStopTimeout(20*time.Second),
				bus.WithObserver(func(ev bus.Event) {
					if ev.Kind == bus.EventHandled && ev.Outcome == bus.OutcomeCommitted && ev.MessageID == "ping-1" {
						committed.Add(1)
					}
				}))
			var err error
			b, err = bus.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.Send(ctx, queue, ping{}, bus.Headers{bus.HeaderMessageType: "StopCallsPing-" + queue, bus.HeaderMessageID: "ping-1"}); err != nil {
				t.Fatal(err)
			}
			<-inside
			sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			began := time.Now()
			stopErr := b.Stop(sctx)
			took := time.Since(began)
			if stopErr != nil {
				t.Errorf("Stop = %v after %v, want a clean drain", stopErr, took)
			}
			if took > 5*time.Second {
				t.Errorf("Stop took %v: it waited on a handler that waited on Stop", took)
			}
			if err := <-calls; err != nil {
				t.Errorf("Publish while Stop drains = %v, want it delivered (the transport is open until the drain ends)", err)
			}
			if err := <-calls; !errors.Is(err, bus.ErrStopping) {
				t.Errorf("Request while Stop drains = %v, want ErrStopping at once", err)
			}
			if n := committed.Load(); n != 1 {
				t.Errorf("the handler's message committed %d times, want 1", n)
			}
		})
	}
}

// TestStopDeadlineCancelsAStuckConsumerInProcess (issue 33, item 2): on
// the in-process transport (the embedded default, and every bustest
// harness) a consumer's context was never canceled, so a consumer waiting
// on it held Stop for ever, whatever Stop's deadline. Now Stop returns
// within its deadline plus a small bound, reporting the deadline, and the
// consumer's context is canceled.
func TestStopDeadlineCancelsAStuckConsumerInProcess(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	canceled := make(chan struct{})
	b, err := bus.New(quiet(), inprocEndpoint("stuck", func(e *endpoint.Endpoint) {
		e.Retry = endpoint.NoRetry()
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ping]) error {
			close(entered)
			<-ctx.Done()
			close(canceled)
			return ctx.Err()
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
	<-entered
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	began := time.Now()
	go func() { stopped <- b.Stop(sctx) }()
	select {
	case err := <-stopped:
		if took := time.Since(began); took > 3*time.Second {
			t.Errorf("Stop took %v with a 500ms deadline", took)
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 deliveries still in flight") {
			t.Errorf("Stop = %v, want the deadline reported with what it abandoned", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not return within 20s with a 500ms deadline: a stuck consumer holds it")
	}
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Error("the stuck consumer's context was not canceled at Stop's deadline")
	}
}

// TestStopWhileStartIsBlocked (issue 33): Stop used to wait for a Start
// that holds the bus's lock (connecting to a broker that does not answer,
// migrating behind another instance's lock) whatever Stop's deadline. Now
// Stop gives up at its deadline and says why; the Start, bounded by its
// own context, is not disturbed.
func TestStopWhileStartIsBlocked(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now: every dial is refused
	b, err := bus.New(quiet(), bus.WithTransport(rabbitmq.New("amqp://guest:guest@"+addr+"/", nil)))
	if err != nil {
		t.Fatal(err)
	}
	startCtx, cancelStart := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelStart()
	started := make(chan error, 1)
	go func() { started <- b.Start(startCtx) }()
	time.Sleep(200 * time.Millisecond) // let Start take the lock; nothing signals that it has
	stopCtx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	err = b.Stop(stopCtx)
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("Stop took %v with a 300ms deadline while Start was blocked", took)
	}
	if err == nil || !strings.Contains(err.Error(), "Start is still running") {
		t.Errorf("Stop = %v, want it to say a Start is still running", err)
	}
	if err := <-started; err == nil {
		t.Error("Start against a broker nobody listens for succeeded")
	}
}

// TestStopWithoutDeadlineIsBoundedByTheStopTimeout (issue 33): Stop with a
// context without deadline, on the embedded default, while a handler
// ignores its context. The router's close gives up at WithStopTimeout; the
// last relay pass then waited for SQLite's one connection, which the
// handler's transaction held, and the handler's context was canceled only
// after that pass: Stop never returned. Now the stop timeout bounds the
// whole Stop when ctx has no deadline.
func TestStopWithoutDeadlineIsBoundedByTheStopTimeout(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	b, err := bus.New(quiet(), bus.WithStopTimeout(time.Second), inprocEndpoint("stuck", func(e *endpoint.Endpoint) {
		e.Retry = endpoint.NoRetry()
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ping]) error {
			close(entered)
			<-release // ignores its context
			return nil
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
	<-entered
	stopped := make(chan error, 1)
	began := time.Now()
	go func() { stopped <- b.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		if took := time.Since(began); took > 6*time.Second {
			t.Errorf("Stop took %v with a stop timeout of 1s", took)
		}
		if err == nil {
			t.Error("Stop returned nil although it abandoned a delivery in flight")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Stop(context.Background()) did not return within 20s with a stop timeout of 1s: a handler that ignores its context holds it")
	}
}
