package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"golang.org/x/sync/errgroup"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

type rrPing struct {
	N    int
	From string
}

type rrPong struct {
	N    int
	From string
}

// rrSetup is one transport for the request/response tests.
type rrSetup struct {
	name string
	// newEnv returns the options of one bus instance with the endpoints
	// declare declares, and unique names, for test t.
	newEnv func(t *testing.T) rrEnv
	// shared says several bus instances meet on the transport.
	shared bool
}

type rrEnv struct {
	options func(declare func(*endpoint.Endpoints)) []bus.Option
	name    func(base string) string // a queue/endpoint/type name unique to the test
}

func rrSetups() []rrSetup {
	return []rrSetup{
		{name: "inproc", newEnv: func(t *testing.T) rrEnv {
			return rrEnv{
				options: func(declare func(*endpoint.Endpoints)) []bus.Option {
					return []bus.Option{quiet(), inprocEndpoints(declare)}
				},
				name: func(base string) string { return base },
			}
		}},
		{name: "rabbitmq", shared: true, newEnv: func(t *testing.T) rrEnv {
			e := newRealEnv(t)
			return rrEnv{
				options: func(declare func(*endpoint.Endpoints)) []bus.Option { return e.options(declare) },
				name: func(base string) string {
					e.typ(base)
					return e.q(base)
				},
			}
		}},
		{name: "pgtransport", shared: true, newEnv: func(t *testing.T) rrEnv {
			e := newPgEnv(t)
			return rrEnv{
				options: func(declare func(*endpoint.Endpoints)) []bus.Option {
					return e.options(e.open(t), declare)
				},
				name: func(base string) string { return base + "-" + e.suffix },
			}
		}},
	}
}

// responder declares endpoint ep consuming ping type typ with fn.
func responder(ep, typ string, fn func(ctx context.Context, c *endpoint.Context[rrPing]) error, configure ...func(*endpoint.Endpoint)) func(*endpoint.Endpoints) {
	return func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
			for _, f := range configure {
				f(e)
			}
			endpoint.Consumer(e, fn, endpoint.AsMessageType(typ))
		})
	}
}

func double(ctx context.Context, c *endpoint.Context[rrPing]) error {
	return c.Respond(ctx, rrPong{N: c.Message.N * 2, From: c.Message.From})
}

func pingHeaders(typ string) bus.RequestOption {
	return bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ})
}

func TestRequestResponse(t *testing.T) {
	for _, s := range rrSetups() {
		t.Run(s.name, func(t *testing.T) {
			t.Run("RoundTrip", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-validate"), env.name("rrPing")
				b := start(t, env.options(responder(ep, typ, double))...)
				ctx := context.Background()
				for i := 1; i <= 3; i++ {
					resp, err := bus.Request[rrPong](ctx, b, ep, rrPing{N: i}, pingHeaders(typ), bus.WithRequestTimeout(10*time.Second))
					if err != nil {
						t.Fatalf("Request %d: %v", i, err)
					}
					if resp.N != 2*i {
						t.Fatalf("Request %d: response %+v, want N=%d", i, resp, 2*i)
					}
				}
				// Raw takes the response as it is.
				raw, err := bus.Request[bus.Raw](ctx, b, "queue:"+ep, rrPing{N: 5}, pingHeaders(typ))
				if err != nil || raw.Type != "rrPong" || !strings.Contains(string(raw.Body), `"N":10`) {
					t.Fatalf("Request[Raw]: %+v %s, %v", raw, raw.Body, err)
				}
				// A response type that is not Resp's is an error, not a zero value.
				if _, err := bus.Request[rrPing](ctx, b, ep, rrPing{N: 1}, pingHeaders(typ)); !errors.Is(err, bus.ErrUnexpectedResponse) {
					t.Fatalf("Request[rrPing] answered by rrPong: %v, want ErrUnexpectedResponse", err)
				}
			})

			t.Run("TimeoutThenLateResponseDropped", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-slow"), env.name("rrPing")
				release := make(chan struct{})
				b := start(t, env.options(responder(ep, typ, func(ctx context.Context, c *endpoint.Context[rrPing]) error {
					if c.Message.N != 0 {
						<-release
					}
					return double(ctx, c)
				}))...)
				warmUp(t, b, ep, typ)
				begin := time.Now()
				_, err := bus.Request[rrPong](context.Background(), b, ep, rrPing{N: 1}, pingHeaders(typ), bus.WithRequestTimeout(300*time.Millisecond))
				if !errors.Is(err, bus.ErrRequestTimeout) {
					t.Fatalf("Request: %v, want ErrRequestTimeout", err)
				}
				if d := time.Since(begin); d < 300*time.Millisecond || d > 5*time.Second {
					t.Fatalf("timed out after %v, want about 300ms", d)
				}
				close(release)
				// No event reports a dropped response: poll the counter.
				waitFor(t, func() bool { return b.Stats().ResponsesDropped == 1 })
				// The endpoint keeps answering.
				if resp, err := bus.Request[rrPong](context.Background(), b, ep, rrPing{N: 4}, pingHeaders(typ)); err != nil || resp.N != 8 {
					t.Fatalf("next Request: %+v, %v", resp, err)
				}
			})

			t.Run("Cancel", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-cancel"), env.name("rrPing")
				release := make(chan struct{})
				defer close(release)
				running := make(chan struct{}, 1)
				b := start(t, env.options(responder(ep, typ, func(ctx context.Context, c *endpoint.Context[rrPing]) error {
					running <- struct{}{}
					<-release
					return nil
				}))...)
				ctx, cancel := context.WithCancel(context.Background())
				go func() { <-running; cancel() }()
				_, err := bus.Request[rrPong](ctx, b, ep, rrPing{N: 1}, pingHeaders(typ))
				if !errors.Is(err, context.Canceled) || errors.Is(err, bus.ErrRequestTimeout) {
					t.Fatalf("Request: %v, want context.Canceled", err)
				}
			})

			t.Run("FaultPropagated", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-fault"), env.name("rrPing")
				var calls atomic.Int32
				b := start(t, env.options(responder(ep, typ, func(ctx context.Context, c *endpoint.Context[rrPing]) error {
					calls.Add(1)
					if c.Message.N < 0 {
						return endpoint.Permanent(errors.New("negative quantity"))
					}
					return fmt.Errorf("validator unavailable for %d", c.Message.N)
				}, func(e *endpoint.Endpoint) { e.Retry = endpoint.Immediate(2) }))...)
				begin := time.Now()
				_, err := bus.Request[rrPong](context.Background(), b, ep, rrPing{N: 7}, pingHeaders(typ))
				var fe *bus.RequestFaultError
				if !errors.As(err, &fe) {
					t.Fatalf("Request: %v, want *RequestFaultError", err)
				}
				if !strings.Contains(fe.Message, "validator unavailable for 7") || fe.Endpoint != ep || fe.Attempts != 3 || fe.Type != "*errors.errorString" {
					t.Fatalf("fault %+v", fe)
				}
				if time.Since(begin) > 10*time.Second {
					t.Fatal("the fault came after the default timeout's order of magnitude")
				}
				// A permanent error: no retries.
				calls.Store(0)
				_, err = bus.Request[rrPong](context.Background(), b, ep, rrPing{N: -1}, pingHeaders(typ))
				if !errors.As(err, &fe) || fe.Attempts != 1 || !strings.Contains(fe.Message, "negative quantity") || calls.Load() != 1 {
					t.Fatalf("permanent: %v (%+v), calls %d", err, fe, calls.Load())
				}
			})

			t.Run("ResponseRolledBackWithConsumer", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-rollback"), env.name("rrPing")
				var attempts atomic.Int32
				b := start(t, env.options(responder(ep, typ, func(ctx context.Context, c *endpoint.Context[rrPing]) error {
					if attempts.Add(1) == 1 {
						// Responded, then failed: the transaction rolls
						// back, and the response with it.
						if err := c.Respond(ctx, rrPong{N: -1}); err != nil {
							return err
						}
						return errors.New("failed after responding")
					}
					return double(ctx, c)
				}, func(e *endpoint.Endpoint) { e.Retry = endpoint.Interval(1, 2500*time.Millisecond) }))...)
				_, err := bus.Request[rrPong](context.Background(), b, ep, rrPing{N: 3}, pingHeaders(typ), bus.WithRequestTimeout(1500*time.Millisecond))
				if !errors.Is(err, bus.ErrRequestTimeout) {
					t.Fatalf("Request: %v, want ErrRequestTimeout (the rolled-back response must not leave)", err)
				}
				// The retry commits; its response comes after the caller
				// gave up and is dropped.
				waitFor(t, func() bool { st := b.Stats(); return st.ResponsesDropped == 1 && st.Consumed == 1 })
			})

			t.Run("UnconsumedDestinationFailsFast", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-present"), env.name("rrPing")
				b := start(t, env.options(responder(ep, typ, double))...)
				for _, dest := range []string{"queue:" + env.name("rr-nobody"), "exchange:" + env.name("rrNobodyType")} {
					begin := time.Now()
					_, err := bus.Request[rrPong](context.Background(), b, dest, rrPing{N: 1}, pingHeaders(typ))
					if !errors.Is(err, bus.ErrNoConsumer) {
						t.Fatalf("Request to %s: %v, want ErrNoConsumer", dest, err)
					}
					if d := time.Since(begin); d > 5*time.Second {
						t.Fatalf("Request to %s failed after %v, want at once", dest, d)
					}
				}
			})

			t.Run("DuplicateRequestNoSecondEffect", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-dup"), env.name("rrPing")
				var calls atomic.Int32
				b := start(t, env.options(responder(ep, typ, func(ctx context.Context, c *endpoint.Context[rrPing]) error {
					calls.Add(1)
					return double(ctx, c)
				}))...)
				h := bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: "rr-dup-1"})
				if _, err := bus.Request[rrPong](context.Background(), b, ep, rrPing{N: 1}, h); err != nil {
					t.Fatal(err)
				}
				_, err := bus.Request[rrPong](context.Background(), b, ep, rrPing{N: 1}, h, bus.WithRequestTimeout(500*time.Millisecond))
				if !errors.Is(err, bus.ErrRequestTimeout) {
					t.Fatalf("duplicate request: %v, want ErrRequestTimeout (no second answer)", err)
				}
				waitStats(t, b, func(st bus.Stats) bool { return st.Duplicates == 1 })
				if calls.Load() != 1 {
					t.Fatalf("consumer ran %d times, want 1", calls.Load())
				}
			})

			t.Run("NotARequest", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-plain"), env.name("rrPing")
				got := make(chan error, 1)
				b := start(t, env.options(responder(ep, typ, func(ctx context.Context, c *endpoint.Context[rrPing]) error {
					got <- c.Respond(ctx, rrPong{})
					return nil
				}))...)
				if err := b.Send(context.Background(), ep, rrPing{}, bus.Headers{bus.HeaderMessageType: typ}); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-got:
					if !errors.Is(err, endpoint.ErrNotARequest) {
						t.Fatalf("Respond to a plain message: %v, want ErrNotARequest", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("consumer did not run")
				}
			})

			if !s.shared {
				return
			}

			t.Run("ThreeInstancesNoCrossedReplies", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-shared"), env.name("rrPing")
				start(t, env.options(responder(ep, typ, double, func(e *endpoint.Endpoint) { e.ConcurrentMessageLimit = 8 }))...)
				none := func(*endpoint.Endpoints) {}
				var g errgroup.Group
				for i := range 3 {
					r := start(t, env.options(none)...)
					from := fmt.Sprintf("instance-%d", i)
					for j := range 15 {
						g.Go(func() error {
							n := i*1000 + j
							resp, err := bus.Request[rrPong](context.Background(), r, ep, rrPing{N: n, From: from}, pingHeaders(typ), bus.WithRequestTimeout(20*time.Second))
							if err != nil {
								return fmt.Errorf("%s request %d: %w", from, n, err)
							}
							if resp.N != 2*n || resp.From != from {
								return fmt.Errorf("%s request %d got %+v: a crossed reply", from, n, resp)
							}
							return nil
						})
					}
				}
				if err := g.Wait(); err != nil {
					t.Fatal(err)
				}
			})

			t.Run("RequesterGoneResponseDropped", func(t *testing.T) {
				env := s.newEnv(t)
				ep, typ := env.name("rr-gone"), env.name("rrPing")
				release := make(chan struct{})
				var once sync.Once
				defer once.Do(func() { close(release) })
				resp := start(t, env.options(responder(ep, typ, func(ctx context.Context, c *endpoint.Context[rrPing]) error {
					if c.Message.N != 0 {
						<-release
					}
					return double(ctx, c)
				}))...)
				req, err := bus.New(env.options(func(*endpoint.Endpoints) {})...)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := req.Start(ctx); err != nil {
					t.Fatal(err)
				}
				warmUp(t, req, ep, typ)
				_, err = bus.Request[rrPong](ctx, req, ep, rrPing{N: 1}, pingHeaders(typ), bus.WithRequestTimeout(300*time.Millisecond))
				if !errors.Is(err, bus.ErrRequestTimeout) {
					t.Fatalf("Request: %v", err)
				}
				if err := req.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				once.Do(func() { close(release) })
				// The response reaches a terminal state: dropped, no row
				// pending or parked in the responder's outbox.
				waitStats(t, resp, func(st bus.Stats) bool { return st.Consumed == 2 })
				waitFor(t, func() bool {
					st, err := resp.OutboxStore().Stats(ctx)
					return err == nil && st.Pending == 0 && st.Parked == 0 && deliveredRows(t, resp.OutboxStore()) >= 1
				})
			})
		})
	}
}

// warmUp makes one round trip (N=0), so that b's reply queue is declared
// before a test measures a short timeout.
func warmUp(t *testing.T, b *bus.Bus, ep, typ string) {
	t.Helper()
	if _, err := bus.Request[rrPong](context.Background(), b, ep, rrPing{N: 0}, pingHeaders(typ), bus.WithRequestTimeout(20*time.Second)); err != nil {
		t.Fatalf("warm-up request: %v", err)
	}
}

func TestRequestOptionsValidated(t *testing.T) {
	b := start(t, quiet())
	ctx := context.Background()
	if _, err := bus.Request[rrPong](ctx, b, "x", rrPing{}, bus.WithRequestTimeout(0)); !errors.Is(err, bus.ErrInvalidOption) {
		t.Fatalf("WithRequestTimeout(0): %v", err)
	}
	if _, err := bus.Request[rrPong](ctx, b, "", rrPing{}); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Fatalf("empty destination: %v", err)
	}
	nb, err := bus.New(quiet())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Request[rrPong](ctx, nb, "x", rrPing{}); !errors.Is(err, bus.ErrNotStarted) {
		t.Fatalf("not started: %v", err)
	}
}

// TestRequestEndsWhenBusStops: a request waiting when its bus stops
// returns ErrStopped, not a timeout much later.
func TestRequestEndsWhenBusStops(t *testing.T) {
	running, release := make(chan struct{}), make(chan struct{})
	b, err := bus.New(quiet(), inprocEndpoints(responder("rr-stop", "rrPing", func(ctx context.Context, c *endpoint.Context[rrPing]) error {
		if c.Message.N == 0 {
			return double(ctx, c)
		}
		close(running)
		<-release
		return nil // no answer
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	warmUp(t, b, "rr-stop", "rrPing")
	got := make(chan error, 1)
	go func() {
		_, err := bus.Request[rrPong](ctx, b, "rr-stop", rrPing{N: 1}, pingHeaders("rrPing"))
		got <- err
	}()
	<-running
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(ctx) }()
	close(release)
	select {
	case err := <-got:
		if !errors.Is(err, bus.ErrStopped) {
			t.Fatalf("Request: %v, want ErrStopped", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Request still waiting after Stop")
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Request[rrPong](ctx, b, "rr-stop", rrPing{N: 0}); !errors.Is(err, bus.ErrNotStarted) {
		t.Fatalf("Request after Stop: %v, want ErrNotStarted", err)
	}
}

// blockingInit is a Watermill subscriber whose topic initialization for
// reply queues waits until released: a broker slow to declare.
type blockingInit struct {
	*gochannel.GoChannel
	release chan struct{}
}

func (s blockingInit) SubscribeInitialize(topic string) error {
	if strings.HasPrefix(topic, "bw.reply.") {
		<-s.release
	}
	return nil
}

func (s blockingInit) Close() error { return nil } // the Pub/Sub is closed once, by the test

// TestRequestsDoNotQueueBehindAReplyQueueDeclaration (issue 33, waits:
// U12): the first request declares the instance's reply queue. That
// declaration held the replies lock while it talked to the broker, so
// every other request, every response and Stop queued behind it whatever
// their deadlines. Now a request waiting for the declaration gives up at
// its own deadline, and Stop is not held.
func TestRequestsDoNotQueueBehindAReplyQueueDeclaration(t *testing.T) {
	t.Parallel()
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer gc.Close()
	release := make(chan struct{})
	b, err := bus.New(quiet(), bus.WithTransport(wmpubsub.New(func(c *wmpubsub.Config) {
		c.Publisher = func(context.Context) (message.Publisher, error) { return blockingInit{gc, release}, nil }
		c.Subscriber = func(context.Context, string) (message.Subscriber, error) { return blockingInit{gc, release}, nil }
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		_, err := bus.Request[bus.Raw](ctx, b, "queue:nobody", bus.Raw{Type: "Q", Body: []byte("{}")}, bus.WithRequestTimeout(2*time.Second))
		first <- err
	}()
	time.Sleep(100 * time.Millisecond) // let the first request start the declaration; nothing signals it
	began := time.Now()
	_, err = bus.Request[bus.Raw](ctx, b, "queue:nobody", bus.Raw{Type: "Q", Body: []byte("{}")}, bus.WithRequestTimeout(200*time.Millisecond))
	if took := time.Since(began); took > time.Second {
		t.Errorf("a request behind a declaration in progress took %v with a 200ms timeout", took)
	}
	if err == nil || !strings.Contains(err.Error(), "wait for the reply queue") {
		t.Errorf("request behind a declaration in progress = %v, want it to give up waiting for the reply queue", err)
	}
	close(release)
	<-first
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Stop(sctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

// TestRequestFromAConsumerOnSQLiteIsRefusedAtOnce (issue 32, defect 4): on
// the embedded default a consumer's Request to an endpoint of the same bus
// always timed out: the consumer's transaction holds SQLite's only
// connection, which the responder needs for its inbox lock. It now fails
// at once with ErrRequestInTransaction, which names the alternatives, and
// a Request made outside a transaction still works.
func TestRequestFromAConsumerOnSQLiteIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	got := make(chan error, 1)
	var b *bus.Bus
	b = start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		responder("pricing", "rrPing", double)(c)
		c.ReceiveEndpoint("orders", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.NoRetry()
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				_, err := bus.Request[rrPong](ctx, b, "pricing", rrPing{N: 1}, pingHeaders("rrPing"), bus.WithRequestTimeout(5*time.Second))
				got <- err
				return nil
			})
		})
	}))
	ctx := context.Background()
	resp, err := bus.Request[rrPong](ctx, b, "pricing", rrPing{N: 2}, pingHeaders("rrPing"), bus.WithRequestTimeout(10*time.Second))
	if err != nil || resp.N != 4 {
		t.Fatalf("Request outside a transaction: %+v, %v", resp, err)
	}
	began := time.Now()
	if err := b.Publish(ctx, PaymentReceived{}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, bus.ErrRequestInTransaction) {
			t.Fatalf("Request from a consumer on SQLite: %v; want ErrRequestInTransaction", err)
		}
		if took := time.Since(began); took > 3*time.Second {
			t.Errorf("refused after %v; want at once, not at the request timeout", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the consumer's Request did not return within 20s")
	}
}
