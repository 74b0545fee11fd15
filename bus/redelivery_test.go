package bus_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

type redeliveryCall struct {
	id, count string
	at        time.Time
}

// TestDelayedRedeliverySurvivesRestart: a message waiting for its delayed
// redelivery is an outbox row, not broker state: the bus is stopped while
// it waits, a new bus started, and the message comes back once, not before
// its delay, with its redelivery count and fault reason.
func TestDelayedRedeliverySurvivesRestart(t *testing.T) {
	type setup struct {
		options func(declare func(*endpoint.Endpoints)) []bus.Option
		queue   string
		typ     string
		empty   func() bool // the endpoint's queue holds nothing
	}
	cases := []struct {
		name string
		make func(t *testing.T) setup
	}{
		{"sqlite", func(t *testing.T) setup {
			path := filepath.Join(t.TempDir(), "bw.db")
			return setup{
				options: func(declare func(*endpoint.Endpoints)) []bus.Option {
					return []bus.Option{quiet(), bus.WithSQLite(path), inprocEndpoints(declare),
						bus.WithOutbox(func(o *outbox.Options) { o.PollingInterval = 100 * time.Millisecond })}
				},
				queue: "later", typ: "Later", empty: func() bool { return true }, // in memory: gone with the bus
			}
		}},
		{"rabbitmq+postgres", func(t *testing.T) setup {
			env := newRealEnv(t)
			q := env.q("later")
			return setup{
				options: func(declare func(*endpoint.Endpoints)) []bus.Option {
					return env.options(declare, func(o *outbox.Options) { o.PollingInterval = 100 * time.Millisecond })
				},
				queue: q, typ: env.typ("Later"),
				empty: func() bool {
					ch, err := env.conn.Channel()
					if err != nil {
						t.Fatal(err)
					}
					defer func() { _ = ch.Close() }()
					st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
					if err != nil {
						t.Fatal(err)
					}
					return st.Messages == 0
				},
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := c.make(t)
			const delay = 1500 * time.Millisecond
			calls := make(chan redeliveryCall, 10)
			declare := func(fail bool) func(*endpoint.Endpoints) {
				return func(eps *endpoint.Endpoints) {
					eps.ReceiveEndpoint(s.queue, func(e *endpoint.Endpoint) {
						e.Retry = endpoint.NoRetry()
						e.Redelivery = []time.Duration{delay}
						endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
							n := d.Headers[bus.HeaderRedeliveryCount]
							calls <- redeliveryCall{id: d.MessageID, count: n, at: time.Now()}
							if fail {
								return fmt.Errorf("first bus fails (redelivery %q)", n)
							}
							if r := d.Headers[bus.HeaderFaultReason]; r == "" {
								return fmt.Errorf("redelivered without %s", bus.HeaderFaultReason)
							}
							return nil
						}, endpoint.ForTypes(s.typ))
					})
				}
			}
			ctx := context.Background()
			b1, err := bus.New(s.options(declare(true))...)
			if err != nil {
				t.Fatal(err)
			}
			if err := b1.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b1.Publish(ctx, bus.Raw{Type: s.typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "later-1"}); err != nil {
				t.Fatal(err)
			}
			first := <-calls
			if first.id != "later-1" || first.count != "" {
				t.Fatalf("first call %+v", first)
			}
			// The redelivery is committed to the outbox, the original acked.
			waitFor(t, func() bool { st, err := b1.OutboxStore().Stats(ctx); return err == nil && st.Pending == 1 })
			waitFor(t, s.empty)
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := b1.Stop(sctx); err != nil {
				t.Fatal(err)
			}

			b2 := start(t, s.options(declare(false))...)
			var second redeliveryCall
			select {
			case second = <-calls:
			case <-time.After(15 * time.Second):
				t.Fatalf("not redelivered after the restart; stats %+v", b2.Stats())
			}
			if second.id != "later-1" || second.count != "1" {
				t.Fatalf("redelivery %+v; want later-1 with count 1", second)
			}
			if gap := second.at.Sub(first.at); gap < delay {
				t.Errorf("redelivered after %v, before its delay %v", gap, delay)
			}
			drain(t, b2)
			select {
			case c := <-calls:
				t.Fatalf("delivered again: %+v", c)
			default:
			}
			if n := processedEntries(t, b2, "later-1"); n != 1 {
				t.Errorf("processed %d times, want 1", n)
			}
		})
	}
}
