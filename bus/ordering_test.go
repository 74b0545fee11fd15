package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/inproc"
)

type OrderStep struct {
	Key string
	Seq int
}

// orderLog records, per key, the sequence numbers a consumer committed, and
// flags two messages of one key handled at once.
type orderLog struct {
	mu       sync.Mutex
	seqs     map[string][]int
	inFlight map[string]int
	overlaps []string
}

func newOrderLog() *orderLog {
	return &orderLog{seqs: map[string][]int{}, inFlight: map[string]int{}}
}

func (l *orderLog) enter(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight[key]++; l.inFlight[key] > 1 {
		l.overlaps = append(l.overlaps, key)
	}
}

func (l *orderLog) leave(key string, seq int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight[key]--
	if ok {
		l.seqs[key] = append(l.seqs[key], seq)
	}
}

// TestOrderedEndpointKeepsKeyOrder: 20 keys × 30 messages published
// interleaved to an endpoint with 4 partitions: every key's messages are
// consumed in publish order, never two of one key at once, and exactly
// once, though some fail their first attempt (retried in process, in their
// partition) and one poison message is dead-lettered in the middle of its
// key, whose later messages then go on.
func TestOrderedEndpointKeepsKeyOrder(t *testing.T) {
	const keys, per = 20, 30
	log := newOrderLog()
	b := start(t, quiet(), inprocEndpoint("ordered-steps", func(e *endpoint.Endpoint) {
		e.Ordered(4)
		e.Retry = endpoint.Immediate(2)
		endpoint.Consumer(e, func(_ context.Context, c *endpoint.Context[OrderStep]) error {
			m := c.Message
			log.enter(m.Key)
			var err error
			switch {
			case m.Key == "k3" && m.Seq == 17:
				err = endpoint.Permanent(errors.New("poison"))
			case m.Seq%7 == 3 && c.Attempt == 1:
				err = errors.New("transient")
			}
			log.leave(m.Key, m.Seq, err == nil)
			return err
		})
	}))
	ctx := context.Background()
	for seq := range per {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			if err := b.Publish(ctx, OrderStep{Key: key, Seq: seq}, bus.OrderingKey(key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitStatsWithin(t, b, 2*time.Minute, func(s bus.Stats) bool { return s.Consumed+s.DeadLettered == keys*per })
	if st := b.Stats(); st.DeadLettered != 1 || st.Retries == 0 {
		t.Fatalf("stats %+v: want 1 dead letter and some retries", st)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.overlaps) > 0 {
		t.Fatalf("two messages of one key ran at once: %v", log.overlaps)
	}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		var want []int
		for seq := range per {
			if key != "k3" || seq != 17 {
				want = append(want, seq)
			}
		}
		if got := log.seqs[key]; !slices.Equal(got, want) {
			t.Fatalf("key %s consumed %v, want %v", key, got, want)
		}
	}
}

// orderedEnv runs an ordered-endpoint test on PostgreSQL (SQLite takes
// one transaction at a time, so keys could not overlap there) with the
// in-process transport or RabbitMQ.
type orderedEnv struct {
	env   *realEnv
	queue string
	typ   string
	opts  func(declare func(*endpoint.Endpoints)) []bus.Option
}

func orderedEnvs(t *testing.T, name string, partitions int) map[string]func(t *testing.T) orderedEnv {
	return map[string]func(t *testing.T) orderedEnv{
		"inproc+postgres": func(t *testing.T) orderedEnv {
			env := newRealEnv(t)
			return orderedEnv{env: env, queue: env.q(name), typ: env.typ("OrderStep"), opts: func(declare func(*endpoint.Endpoints)) []bus.Option {
				return []bus.Option{quiet(), inprocEndpoints(declare), bus.WithDatabase(env.db),
					bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = env.prefix })}
			}}
		},
		"rabbitmq+postgres": func(t *testing.T) orderedEnv {
			env := newRealEnv(t)
			q := env.q(name)
			env.orderedCleanup(t, q, partitions)
			return orderedEnv{env: env, queue: q, typ: env.typ("OrderStep"), opts: func(declare func(*endpoint.Endpoints)) []bus.Option {
				return env.options(declare)
			}}
		},
	}
}

// orderedCleanup removes an ordered endpoint's partition queues and
// exchanges when the test ends.
func (e *realEnv) orderedCleanup(t *testing.T, q string, partitions int) {
	t.Cleanup(func() {
		ch, err := e.conn.Channel()
		if err != nil {
			return
		}
		defer func() { _ = ch.Close() }()
		for i := range partitions {
			_, _ = ch.QueueDelete(wire.PartitionQueue(q, i), false, false, false)
		}
		_ = ch.ExchangeDelete(q+".ordered", false, false)
		_ = ch.ExchangeDelete(q+".unkeyed", false, false)
	})
}

// TestOrderedEndpointRunsKeysInParallel: messages of two keys in different
// partitions are handled at the same time (each waits until the other has
// started), and a message without a key still reaches the consumer.
func TestOrderedEndpointRunsKeysInParallel(t *testing.T) {
	t.Parallel()
	var a, c string // two keys in different partitions of 4
	for i := 0; c == ""; i++ {
		k := fmt.Sprintf("key-%d", i)
		switch {
		case a == "":
			a = k
		case wire.PartitionOf(k, 4) != wire.PartitionOf(a, 4):
			c = k
		}
	}
	for name, setup := range orderedEnvs(t, "ordered-parallel", 4) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			oe := setup(t)
			started := map[string]chan struct{}{a: make(chan struct{}), c: make(chan struct{})}
			unkeyed := make(chan struct{})
			b := start(t, oe.opts(func(eps *endpoint.Endpoints) {
				eps.ReceiveEndpoint(oe.queue, func(e *endpoint.Endpoint) {
					e.Ordered(4)
					endpoint.Consumer(e, func(ctx context.Context, m *endpoint.Context[OrderStep]) error {
						if m.Message.Key == "" {
							close(unkeyed)
							return nil
						}
						close(started[m.Message.Key])
						other := a
						if m.Message.Key == a {
							other = c
						}
						select {
						case <-started[other]:
							return nil
						case <-time.After(10 * time.Second):
							return endpoint.Permanent(fmt.Errorf("key %s never ran beside key %s", other, m.Message.Key))
						}
					}, endpoint.AsMessageType(oe.typ))
				})
			})...)
			ctx := context.Background()
			for _, k := range []string{a, c} {
				if err := b.Publish(ctx, OrderStep{Key: k}, bus.OrderingKey(k, bus.Headers{bus.HeaderMessageType: oe.typ})); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Publish(ctx, OrderStep{}, bus.Headers{bus.HeaderMessageType: oe.typ}); err != nil {
				t.Fatal(err)
			}
			waitStats(t, b, func(s bus.Stats) bool { return s.Consumed+s.DeadLettered == 3 })
			if st := b.Stats(); st.DeadLettered != 0 {
				t.Fatalf("keys in different partitions did not run in parallel: %+v", st)
			}
			<-unkeyed
		})
	}
}

type keyedEvent struct{ OrderID string }

// TestOrderingConfigErrors: bad ordering configuration fails at New or
// Start with a message that says what to change, and bad keys are refused
// at publish.
func TestOrderingConfigErrors(t *testing.T) {
	consumer := func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(context.Context, *endpoint.Context[OrderStep]) error { return nil })
	}
	for _, tc := range []struct {
		name      string
		configure func(e *endpoint.Endpoint)
		want      string
	}{
		{"zero partitions", func(e *endpoint.Endpoint) { e.Ordered(0) }, "partitions must be within 1–64"},
		{"too many partitions", func(e *endpoint.Endpoint) { e.Ordered(65) }, "partitions must be within 1–64"},
		{"with redelivery", func(e *endpoint.Endpoint) { e.Ordered(2); e.Redelivery = []time.Duration{time.Second} }, "cannot be combined with Redelivery"},
		{"stream queue", func(e *endpoint.Endpoint) { e.Ordered(2); e.Queue.Type = endpoint.Stream }, "stream queue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bus.New(quiet(), inprocEndpoint("cfg", func(e *endpoint.Endpoint) { consumer(e); tc.configure(e) }))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("key function given twice", func(t *testing.T) {
		f := func(e keyedEvent) string { return e.OrderID }
		_, err := bus.New(quiet(), bus.WithOrderingKey(f), bus.WithOrderingKey(f))
		if !errors.Is(err, bus.ErrInvalidOption) {
			t.Fatalf("New: %v, want ErrInvalidOption", err)
		}
	})
	t.Run("bad keys refused at publish", func(t *testing.T) {
		b := start(t, quiet())
		for _, k := range []string{"", string(make([]byte, 256)), "\xff"} {
			if err := b.Publish(context.Background(), OrderStep{}, bus.OrderingKey(k)); !errors.Is(err, bus.ErrInvalidMessage) {
				t.Errorf("key %q: %v, want ErrInvalidMessage", k, err)
			}
		}
	})
}

// TestOrderingKeyFromMessage: WithOrderingKey sets the key from the
// message; an explicit header wins.
func TestOrderingKeyFromMessage(t *testing.T) {
	got := make(chan string, 2)
	b := start(t, quiet(), bus.WithOrderingKey(func(e keyedEvent) string { return "order-" + e.OrderID }),
		inprocEndpoint("ordered-keyfn", func(e *endpoint.Endpoint) {
			e.Ordered(2)
			endpoint.Consumer(e, func(_ context.Context, c *endpoint.Context[keyedEvent]) error {
				got <- c.Headers[bus.HeaderOrderingKey]
				return nil
			})
		}))
	ctx := context.Background()
	if err := b.Publish(ctx, keyedEvent{OrderID: "7"}, nil); err != nil {
		t.Fatal(err)
	}
	if k := <-got; k != "order-7" {
		t.Fatalf("key %q, want order-7", k)
	}
	if err := b.Publish(ctx, keyedEvent{OrderID: "7"}, bus.OrderingKey("mine")); err != nil {
		t.Fatal(err)
	}
	if k := <-got; k != "mine" {
		t.Fatalf("key %q, want mine", k)
	}
}

// unkeyedFactory builds the in-process transport hidden behind the bare
// Transport interface: a transport that cannot route keys.
type unkeyedFactory struct{ *inproc.Transport }

func (f unkeyedFactory) Build(env transport.Env) (transport.Transport, error) {
	tr, err := f.Transport.Build(env)
	return struct{ transport.Transport }{tr}, err
}

// TestOrderingRefusedWithoutKeyRouting: an ordered endpoint on a transport
// that does not implement transport.KeyPartitioner fails Start with
// ErrOrderingUnsupported naming the endpoint, and nothing is consumed.
func TestOrderingRefusedWithoutKeyRouting(t *testing.T) {
	b, err := bus.New(quiet(), bus.WithTransport(unkeyedFactory{inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("needs-order", func(e *endpoint.Endpoint) {
			e.Ordered(2)
			endpoint.Consumer(e, func(context.Context, *endpoint.Context[OrderStep]) error { return nil })
		})
	})}))
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start(context.Background())
	if !errors.Is(err, bus.ErrOrderingUnsupported) || !strings.Contains(err.Error(), `"needs-order"`) {
		_ = b.Stop(context.Background())
		t.Fatalf("Start: %v, want ErrOrderingUnsupported naming the endpoint", err)
	}
}

// TestEndpointBecomesOrdered: an endpoint that ran unordered on RabbitMQ
// (its type exchange bound to its queue) and is then made ordered loses
// that binding at start, so a keyed message reaches only its partition,
// not also the endpoint's own queue through the old binding.
func TestEndpointBecomesOrdered(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	q, typ := env.q("becomes-ordered"), env.typ("OrderStep")
	env.orderedCleanup(t, q, 2)
	ctx := context.Background()
	for _, partitions := range []int{0, 2} { // declare unordered, then ordered
		b, err := bus.New(env.options(func(eps *endpoint.Endpoints) {
			eps.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
				if partitions > 0 {
					e.Ordered(partitions)
				}
				endpoint.Consumer(e, func(context.Context, *endpoint.Context[OrderStep]) error { return nil }, endpoint.AsMessageType(typ))
			})
		})...)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// With no consumer running, publish a message of slot 0 (partition 0)
	// and count where it landed.
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, typ, "", false, false, amqp.Publishing{
		MessageId: "slot0", Type: typ, Body: []byte(`{}`), Headers: amqp.Table{wire.HeaderOrderingSlot: "0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("not confirmed: %v", err)
	}
	count := func(name string) int {
		st, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st.Messages
	}
	if own, p0 := count(q), count(wire.PartitionQueue(q, 0)); own != 0 || p0 != 1 {
		t.Fatalf("endpoint queue holds %d, partition 0 holds %d; want 0 and 1", own, p0)
	}
}
