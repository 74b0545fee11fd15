package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
)

// drainTransport is one real transport for the Stop tests: the bus options
// for an endpoint, and how many messages wait in the endpoint's queue
// (ready or leased, not acked) once the bus has stopped.
type drainTransport struct {
	name    string
	options func(t *testing.T) (opts func(declare func(*endpoint.Endpoints)) []bus.Option, queue, typ string, waiting func() int)
}

func drainTransports() []drainTransport {
	return []drainTransport{
		{"rabbitmq", func(t *testing.T) (func(func(*endpoint.Endpoints)) []bus.Option, string, string, func() int) {
			env := newRealEnv(t)
			q, typ := env.q("drain"), env.typ("Drain")
			waiting := func() int {
				ch, err := env.conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = ch.Close() }()
				st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				return st.Messages
			}
			return func(d func(*endpoint.Endpoints)) []bus.Option { return env.options(d) }, q, typ, waiting
		}},
		{"postgres", func(t *testing.T) (func(func(*endpoint.Endpoints)) []bus.Option, string, string, func() int) {
			env := newPgEnv(t)
			q, typ := "drain-"+env.suffix, "Drain-"+env.suffix
			waiting := func() int { hs, _ := env.rows(t, q); return len(hs) }
			return func(d func(*endpoint.Endpoints)) []bus.Option { return env.options(env.db, d) }, q, typ, waiting
		}},
	}
}

// TestStopDrainsInFlightOnRealTransports: Stop waits for the handler in
// flight, which commits with an uncanceled context; its message is acked
// (not redelivered); the message behind it (already prefetched on
// RabbitMQ) is not started and stays in the queue.
func TestStopDrainsInFlightOnRealTransports(t *testing.T) {
	for _, tr := range drainTransports() {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			options, q, typ, waiting := tr.options(t)
			entered := make(chan string, 4)
			release := make(chan struct{})
			b, err := bus.New(options(func(c *endpoint.Endpoints) {
				c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
					e.ConcurrentMessageLimit = 1
					e.PrefetchCount = 4
					e.Retry = endpoint.NoRetry()
					endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
						entered <- d.MessageID
						<-release
						return ctx.Err() // a canceled handler does not commit
					}, endpoint.ForTypes(typ))
				})
			})...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"first", "second"} {
				if err := b.Publish(ctx, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
					t.Fatal(err)
				}
			}
			if id := <-entered; id != "first" {
				t.Fatalf("first handler got %q", id)
			}
			stopped := make(chan error, 1)
			go func() {
				sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				stopped <- b.Stop(sctx)
			}()
			select {
			case err := <-stopped:
				t.Fatalf("Stop returned (%v) while a handler was in flight", err)
			case <-time.After(300 * time.Millisecond): // nothing to wait for: Stop must not return
			}
			close(release)
			if err := <-stopped; err != nil {
				t.Fatalf("Stop: %v", err)
			}
			select {
			case id := <-entered:
				t.Fatalf("message %q started after Stop began", id)
			default:
			}
			if n := processedEntries(t, b, "first"); n != 1 {
				t.Errorf("in-flight message processed %d times, want 1 (committed before Stop returned)", n)
			}
			if n := waiting(); n != 1 {
				t.Errorf("%d messages wait in the queue after Stop, want 1 (the unstarted one; the drained one acked)", n)
			}
		})
	}
}

// TestStopDeadlineBoundsDrain: a handler that does not finish cannot hold
// Stop past its context's deadline; its message is not acked.
func TestStopDeadlineBoundsDrain(t *testing.T) {
	for _, tr := range drainTransports() {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			options, q, typ, waiting := tr.options(t)
			entered := make(chan struct{}, 1)
			b, err := bus.New(options(func(c *endpoint.Endpoints) {
				c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
					e.Retry = endpoint.NoRetry()
					endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
						entered <- struct{}{}
						<-ctx.Done() // stuck until the transport gives up on it
						return ctx.Err()
					}, endpoint.ForTypes(typ))
				})
			})...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.Publish(ctx, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "stuck"}); err != nil {
				t.Fatal(err)
			}
			<-entered
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			began := time.Now()
			err = b.Stop(sctx)
			if took := time.Since(began); took > 5*time.Second {
				t.Errorf("Stop took %v with a 500ms deadline", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Stop = %v, want the deadline reported", err)
			}
			if n := waiting(); n != 1 {
				t.Errorf("%d messages wait in the queue, want 1 (the unfinished one, not acked)", n)
			}
		})
	}
}
