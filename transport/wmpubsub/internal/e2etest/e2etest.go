// Package e2etest runs the bus end to end on a wmpubsub preset, with the
// inbox and outbox on PostgreSQL: exactly-once effects through duplicates,
// in-process retries and delayed redeliveries; a Watermill message without
// a UUID dead-lettered without stopping its neighbours; and, where the
// Pub/Sub redelivers a message its consumer holds too long (JetStream
// AckWait, a Redis consumer group's pending claim), the second delivery
// absorbed by the inbox; and where consumers own pending entries (Redis),
// those of a consumer gone claimed by the bus and processed once.
package e2etest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// Config says how to build the preset under test.
type Config struct {
	// New returns the preset's factory with the endpoints declare
	// declares. slow is true for the Slow case, which needs the Pub/Sub's
	// redelivery timeout (AckWait, MaxIdleTime) short: about a second.
	New func(t *testing.T, slow bool, declare func(*endpoint.Endpoints)) transport.Factory
	// Inject publishes msg to topic with a plain Watermill publisher of
	// the Pub/Sub, as a Watermill-native service would.
	Inject func(t *testing.T, topic string, msg *message.Message)
	// TypeTopic is the topic of message type typ (Topics.Type).
	TypeTopic func(typ string) string
	// Slow says the Pub/Sub redelivers a message held longer than its
	// redelivery timeout; the Slow case is skipped otherwise.
	Slow bool
	// DedupsPublishes says the Pub/Sub drops a message published again
	// with the same id (JetStream's Nats-Msg-Id window), so that the
	// copies published twice never reach the inbox.
	DedupsPublishes bool
	// Orphan, when set, publishes msgs to topic and has a consumer other
	// than the bus's read them into its pending entries in group (the
	// endpoint's consumer group, created if need be) and go away without
	// acknowledging them: a consumer gone in a group rebalance (Redis).
	// The DepartedConsumer case then starts the bus and checks that it
	// claims them.
	Orphan func(t *testing.T, topic, group string, msgs ...*message.Message)
	// QueueTopicExists reports whether the topic of queue exists on the
	// Pub/Sub (a stream, a RabbitMQ queue). Required.
	QueueTopicExists func(t *testing.T, queue string) bool
	// Cleanup deletes the endpoints' queues and the types' topics.
	Cleanup func(t *testing.T, queues, types []string)
	// Refuse makes the Pub/Sub refuse every later publish to topic (a
	// full queue or stream that rejects new messages, a key of another
	// type), for the RefusedPublishNeverDelivered case. Required.
	Refuse func(t *testing.T, topic string)
}

// Order is the test's message.
type Order struct {
	N int `json:"n"`
}

// effect is one consumer's business effect, written in its transaction.
type effect struct {
	ID        int64 `gorm:"primaryKey"`
	Endpoint  string
	MessageID string
}

// Run runs every case as a subtest.
func Run(t *testing.T, c Config) {
	t.Run("ExactlyOnceThroughDuplicatesRetriesAndRedeliveries", func(t *testing.T) { exactlyOnce(t, c) })
	t.Run("MessageWithoutUUIDDeadLetteredNeighboursFlow", func(t *testing.T) { noUUID(t, c) })
	t.Run("SlowConsumerRedeliveredByThePubSubRunsOnce", func(t *testing.T) {
		if !c.Slow {
			t.Skip("the Pub/Sub does not redeliver a message its consumer holds (Config.Slow is false)")
		}
		slow(t, c)
	})
	t.Run("DepartedConsumersPendingClaimedOnce", func(t *testing.T) {
		if c.Orphan == nil {
			t.Skip("the Pub/Sub has no consumer-owned pending entries (Config.Orphan is nil)")
		}
		departed(t, c)
	})
	t.Run("RefusedPublishNeverDelivered", func(t *testing.T) { refused(t, c) })
	t.Run("StopDrainsInFlight", func(t *testing.T) { stopDrains(t, c) })
	t.Run("RequestResponse", func(t *testing.T) { requestResponse(t, c) })
	t.Run("RequestToNoConsumerFailsFast", func(t *testing.T) { requestNoConsumer(t, c) })
	t.Run("ReplyTopicRemovedAtStop", func(t *testing.T) { replyTopicRemoved(t, c) })
}

type env struct {
	t      *testing.T
	c      Config
	suffix string
	db     *gorm.DB
	events chan bus.Event

	mu      sync.Mutex
	handled map[string]map[string]int // endpoint → outcome → count
	replies []string                  // reply queues the buses declared
}

func newEnv(t *testing.T, c Config) *env {
	dsn := testenv.PostgresDSN(t)
	admin, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	adminSQL, err := admin.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adminSQL.Close() })
	_, schemaDSN := testenv.PostgresSchema(t, adminSQL, dsn)
	db, err := postgresdb.Open(schemaDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})
	if err := db.AutoMigrate(&effect{}); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &env{t: t, c: c, suffix: hex.EncodeToString(b[:]), db: db, events: make(chan bus.Event, 1024),
		handled: map[string]map[string]int{}}
}

func (e *env) name(s string) string { return s + "-" + e.suffix }

// start starts a bus on the preset; queues and types are cleaned up after.
// more edit the outbox options after the suite's own.
func (e *env) start(slow bool, queues, types []string, declare func(*endpoint.Endpoints), more ...func(*outbox.Options)) *bus.Bus {
	t := e.t
	if e.c.Cleanup != nil {
		t.Cleanup(func() { e.c.Cleanup(t, append(queues, errorQueues(queues)...), types) })
	}
	if e.c.Cleanup != nil { // after Stop, which has declared its reply queue by then
		t.Cleanup(func() {
			e.mu.Lock()
			replies := append([]string(nil), e.replies...)
			e.mu.Unlock()
			if len(replies) > 0 {
				e.c.Cleanup(t, replies, nil)
			}
		})
	}
	b, err := bus.New(
		bus.WithLogger(slog.New(replyRecorder{e})),
		bus.WithDatabase(e.db),
		bus.WithOutbox(func(o *outbox.Options) {
			o.PollingInterval = 100 * time.Millisecond
			for _, f := range more {
				f(o)
			}
		}),
		bus.WithObserver(func(ev bus.Event) {
			if ev.Kind != bus.EventHandled {
				return
			}
			e.mu.Lock()
			if e.handled[ev.Endpoint] == nil {
				e.handled[ev.Endpoint] = map[string]int{}
			}
			e.handled[ev.Endpoint][ev.Outcome]++
			e.mu.Unlock()
			select {
			case e.events <- ev:
			default:
			}
		}),
		bus.WithTransport(e.c.New(t, slow, declare)),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return b
}

func errorQueues(qs []string) []string {
	var out []string
	for _, q := range qs {
		out = append(out, q+"_error")
	}
	return out
}

// record is a consumer that writes its effect in the delivery's
// transaction.
func record(name string) func(context.Context, *endpoint.Context[Order]) error {
	return func(ctx context.Context, c *endpoint.Context[Order]) error {
		return bus.TxFromContext(ctx).Create(&effect{Endpoint: name, MessageID: c.MessageID}).Error
	}
}

// effects counts effect rows per endpoint and message id.
func (e *env) effects() map[[2]string]int {
	var rows []effect
	if err := e.db.Find(&rows).Error; err != nil {
		e.t.Fatal(err)
	}
	out := map[[2]string]int{}
	for _, r := range rows {
		out[[2]string{r.Endpoint, r.MessageID}]++
	}
	return out
}

// waitEffects waits until every key has an effect, then a little longer
// for a stray second one to show.
func (e *env) waitEffects(keys [][2]string, timeout time.Duration) map[[2]string]int {
	deadline := time.Now().Add(timeout)
	for {
		got := e.effects()
		missing := 0
		for _, k := range keys {
			if got[k] == 0 {
				missing++
			}
		}
		if missing == 0 {
			return got
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d of %d effects missing after %v (handled: %v)", missing, len(keys), timeout, e.outcomes())
		}
		select {
		case <-e.events:
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (e *env) outcomes() map[string]map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]map[string]int{}
	for k, v := range e.handled {
		out[k] = map[string]int{}
		for o, n := range v {
			out[k][o] = n
		}
	}
	return out
}

func (e *env) outcome(endpoint, outcome string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.handled[endpoint][outcome]
}

func exactlyOnce(t *testing.T, c Config) {
	e := newEnv(t, c)
	typ := e.name("OrderPlaced")
	billing, audit, flaky := e.name("billing"), e.name("audit"), e.name("flaky")
	var mu sync.Mutex
	attempts := map[string]int{}
	b := e.start(false, []string{billing, audit, flaky}, []string{typ}, func(d *endpoint.Endpoints) {
		for _, name := range []string{billing, audit} {
			d.ReceiveEndpoint(name, func(ep *endpoint.Endpoint) {
				ep.Retry = endpoint.Immediate(2)
				endpoint.Consumer(ep, func(ctx context.Context, oc *endpoint.Context[Order]) error {
					// Every third message fails its first attempt: retried
					// in process.
					mu.Lock()
					attempts[name+oc.MessageID]++
					n := attempts[name+oc.MessageID]
					mu.Unlock()
					if oc.Message.N%3 == 0 && n == 1 {
						return fmt.Errorf("transient failure of %s", oc.MessageID)
					}
					return record(name)(ctx, oc)
				}, endpoint.AsMessageType(typ))
			})
		}
		d.ReceiveEndpoint(flaky, func(ep *endpoint.Endpoint) {
			// No in-process retry: a failure goes through the outbox as a
			// delayed redelivery to the endpoint's own topic.
			ep.Retry = endpoint.NoRetry()
			ep.Redelivery = []time.Duration{200 * time.Millisecond, 200 * time.Millisecond}
			endpoint.Consumer(ep, func(ctx context.Context, oc *endpoint.Context[Order]) error {
				mu.Lock()
				attempts[flaky+oc.MessageID]++
				n := attempts[flaky+oc.MessageID]
				mu.Unlock()
				if n == 1 {
					return fmt.Errorf("first delivery of %s fails", oc.MessageID)
				}
				return record(flaky)(ctx, oc)
			}, endpoint.AsMessageType(typ+".direct"))
		})
	})
	ctx := context.Background()
	const n = 12
	var keys [][2]string
	for i := range n {
		id := e.name(fmt.Sprintf("order-%02d", i))
		h := bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: typ}
		// Through the outbox, in a transaction.
		if err := e.db.Transaction(func(tx *gorm.DB) error { return b.PublishTx(ctx, tx, Order{N: i}, h) }); err != nil {
			t.Fatal(err)
		}
		// And the same message again, straight to the Pub/Sub: a
		// duplicate for the inbox to absorb.
		if err := b.Publish(ctx, Order{N: i}, h); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, [2]string{billing, id}, [2]string{audit, id})
		if i < 4 {
			// Sent to one endpoint (its own topic), failing its first
			// delivery, redelivered through the outbox.
			did := e.name(fmt.Sprintf("direct-%02d", i))
			if err := b.Send(ctx, "queue:"+flaky, Order{N: i}, bus.Headers{bus.HeaderMessageID: did, bus.HeaderMessageType: typ + ".direct"}); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, [2]string{flaky, did})
		}
	}
	e.waitEffects(keys, 60*time.Second)
	// Both copies of every message handled before we count.
	deadline := time.Now().Add(30 * time.Second)
	for !c.DedupsPublishes && (e.outcome(billing, bus.OutcomeDuplicate) < n || e.outcome(audit, bus.OutcomeDuplicate) < n) {
		if time.Now().After(deadline) {
			t.Fatalf("duplicates not all absorbed: %v", e.outcomes())
		}
		select {
		case <-e.events:
		case <-time.After(200 * time.Millisecond):
		}
	}
	got := e.effects()
	for _, k := range keys {
		if got[k] != 1 {
			t.Errorf("effect of %s on %s applied %d times, want once", k[1], k[0], got[k])
		}
	}
	if len(got) != len(keys) {
		t.Errorf("%d distinct effects, want %d", len(got), len(keys))
	}
	if r := e.outcome(flaky, bus.OutcomeRedelivery); r != 4 {
		t.Errorf("flaky endpoint scheduled %d redeliveries, want 4 (outcomes %v)", r, e.outcomes())
	}
	t.Logf("outcomes: %v", e.outcomes())
}

func noUUID(t *testing.T, c Config) {
	e := newEnv(t, c)
	typ := e.name("OrderPlaced")
	ep := e.name("orders")
	b := e.start(false, []string{ep}, []string{typ}, func(d *endpoint.Endpoints) {
		d.ReceiveEndpoint(ep, func(x *endpoint.Endpoint) {
			endpoint.Consumer(x, record(ep), endpoint.AsMessageType(typ))
		})
	})
	body, _ := json.Marshal(Order{N: 1})
	// A Watermill-native publisher that sets no UUID and no type: typed by
	// the topic, refused for its missing id.
	c.Inject(t, c.TypeTopic(typ), message.NewMessage("", body))
	id := e.name("after")
	if err := b.Publish(context.Background(), Order{N: 2}, bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: typ}); err != nil {
		t.Fatal(err)
	}
	e.waitEffects([][2]string{{ep, id}}, 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for e.outcome(ep, bus.OutcomeDeadLettered) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("message without a UUID not dead-lettered: %v", e.outcomes())
		}
		select {
		case <-e.events:
		case <-time.After(200 * time.Millisecond):
		}
	}
	// Terminal: it does not come back.
	// No event signals that something did not happen: watch for a second.
	time.Sleep(time.Second)
	if n := e.outcome(ep, bus.OutcomeDeadLettered); n != 1 {
		t.Errorf("dead-lettered %d times, want once (a loop)", n)
	}
	if got := e.effects(); len(got) != 1 {
		t.Errorf("effects %v, want only the neighbour's", got)
	}
}

func slow(t *testing.T, c Config) {
	e := newEnv(t, c)
	typ := e.name("OrderPlaced")
	ep := e.name("slow")
	var mu sync.Mutex
	calls := map[string]int{}
	b := e.start(true, []string{ep}, []string{typ}, func(d *endpoint.Endpoints) {
		d.ReceiveEndpoint(ep, func(x *endpoint.Endpoint) {
			x.ConcurrentMessageLimit = 2
			endpoint.Consumer(x, func(ctx context.Context, oc *endpoint.Context[Order]) error {
				mu.Lock()
				calls[oc.MessageID]++
				first := calls[oc.MessageID] == 1
				mu.Unlock()
				if first && oc.Message.N == 0 {
					// Held past the Pub/Sub's redelivery timeout: the
					// message comes again while this runs.
					select {
					case <-time.After(3 * time.Second):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return record(ep)(ctx, oc)
			}, endpoint.AsMessageType(typ))
		})
	})
	var keys [][2]string
	for i := range 3 {
		id := e.name(fmt.Sprintf("slow-%d", i))
		if err := b.Publish(context.Background(), Order{N: i}, bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: typ}); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, [2]string{ep, id})
	}
	e.waitEffects(keys, 60*time.Second)
	// The redelivery of the slow message must reach the inbox: while the
	// first delivery runs it is handed back (requeued: its entry is
	// locked elsewhere); after the first one committed it is a duplicate.
	// Which of the two it ends as depends on when the Pub/Sub sends it
	// again (JetStream stops once the first delivery's late ack lands).
	deadline := time.Now().Add(30 * time.Second)
	for e.outcome(ep, bus.OutcomeDuplicate)+e.outcome(ep, bus.OutcomeRequeued) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the Pub/Sub's redelivery of the slow message never reached the inbox: %v", e.outcomes())
		}
		select {
		case <-e.events:
		case <-time.After(200 * time.Millisecond):
		}
	}
	got := e.effects()
	for _, k := range keys {
		if got[k] != 1 {
			t.Errorf("effect of %s applied %d times, want once", k[1], got[k])
		}
	}
	t.Logf("outcomes: %v", e.outcomes())
}

// replyRecorder is the buses' log handler: it drops every record but notes
// the name of each reply queue declared ("reply queue declared", queue=),
// for the cleanup.
type replyRecorder struct{ e *env }

func (replyRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h replyRecorder) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h replyRecorder) WithGroup(string) slog.Handler          { return h }
func (h replyRecorder) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "reply queue declared" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "queue" {
			h.e.mu.Lock()
			h.e.replies = append(h.e.replies, a.Value.String())
			h.e.mu.Unlock()
			return false
		}
		return true
	})
	return nil
}

// Ping is the test's request; Pong its response.
type Ping struct {
	N    int    `json:"n"`
	From string `json:"from"`
}

// Pong is the response to a Ping.
type Pong struct {
	N    int    `json:"n"`
	From string `json:"from"`
}

func doubler(ep, typ string, fn func(ctx context.Context, c *endpoint.Context[Ping]) error, configure ...func(*endpoint.Endpoint)) func(*endpoint.Endpoints) {
	return func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
			for _, f := range configure {
				f(e)
			}
			endpoint.Consumer(e, fn, endpoint.AsMessageType(typ))
		})
	}
}

func double(ctx context.Context, c *endpoint.Context[Ping]) error {
	return c.Respond(ctx, Pong{N: 2 * c.Message.N, From: c.Message.From})
}

// requestResponse runs bus.Request over the preset's reply queues: a round
// trip, a consumer's fault coming back as *bus.RequestFaultError, and three
// bus instances sharing one endpoint, requesting concurrently, each getting
// its own answers.
func requestResponse(t *testing.T, c Config) {
	t.Run("RoundTrip", func(t *testing.T) {
		e := newEnv(t, c)
		ep, typ := e.name("rr-double"), e.name("Ping")
		b := e.start(false, []string{ep}, []string{typ}, doubler(ep, typ, double))
		for i := 1; i <= 3; i++ {
			resp, err := bus.Request[Pong](context.Background(), b, ep, Ping{N: i},
				bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ}), bus.WithRequestTimeout(20*time.Second))
			if err != nil {
				t.Fatalf("Request %d: %v", i, err)
			}
			if resp.N != 2*i {
				t.Fatalf("Request %d: response %+v, want N=%d", i, resp, 2*i)
			}
		}
	})

	t.Run("FaultPropagated", func(t *testing.T) {
		e := newEnv(t, c)
		ep, typ := e.name("rr-fault"), e.name("Ping")
		b := e.start(false, []string{ep}, []string{typ}, doubler(ep, typ, func(ctx context.Context, c *endpoint.Context[Ping]) error {
			if c.Message.N < 0 {
				return endpoint.Permanent(errors.New("negative quantity"))
			}
			return fmt.Errorf("validator unavailable for %d", c.Message.N)
		}, func(e *endpoint.Endpoint) { e.Retry = endpoint.Immediate(1) }))
		hdr := bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ})
		_, err := bus.Request[Pong](context.Background(), b, ep, Ping{N: 7}, hdr, bus.WithRequestTimeout(20*time.Second))
		var fe *bus.RequestFaultError
		if !errors.As(err, &fe) {
			t.Fatalf("Request: %v, want *bus.RequestFaultError", err)
		}
		if !strings.Contains(fe.Message, "validator unavailable for 7") || fe.Endpoint != ep || fe.Attempts != 2 {
			t.Fatalf("fault %+v, want endpoint %q, 2 attempts, the consumer's message", fe, ep)
		}
		_, err = bus.Request[Pong](context.Background(), b, ep, Ping{N: -1}, hdr, bus.WithRequestTimeout(20*time.Second))
		if !errors.As(err, &fe) || fe.Attempts != 1 || !strings.Contains(fe.Message, "negative quantity") {
			t.Fatalf("permanent: %v (%+v), want a fault after 1 attempt", err, fe)
		}
	})

	t.Run("ThreeBusesConcurrentNoCrossedReplies", func(t *testing.T) {
		e := newEnv(t, c)
		ep, typ := e.name("rr-shared"), e.name("Ping")
		const buses, perBus = 3, 8
		bs := make([]*bus.Bus, buses)
		for i := range bs {
			bs[i] = e.start(false, []string{ep}, []string{typ}, doubler(ep, typ, double))
		}
		var wg sync.WaitGroup
		errs := make(chan error, buses*perBus)
		for i, b := range bs {
			for n := 1; n <= perBus; n++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					from := fmt.Sprintf("bus-%d", i)
					resp, err := bus.Request[Pong](context.Background(), b, ep, Ping{N: 100*i + n, From: from},
						bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ}), bus.WithRequestTimeout(30*time.Second))
					switch {
					case err != nil:
						errs <- fmt.Errorf("%s request %d: %w", from, n, err)
					case resp.From != from || resp.N != 2*(100*i+n):
						errs <- fmt.Errorf("%s request %d got %+v: a crossed reply", from, n, resp)
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// refused: the Pub/Sub refuses every publish of one message type (Refuse)
// while another type is accepted. A publish the broker refused must never
// be recorded as delivered (issue 31 found RabbitMQ's nacks read as acks
// on the bus's own transport): a direct Publish returns the error, and
// outbox rows of the refused type are retried and parked with the
// broker's reason after MaxAttempts, while their neighbours in the same
// transactions and batches are delivered at their first attempt.
func refused(t *testing.T, c Config) {
	if c.Refuse == nil {
		t.Fatal("Config.Refuse is required")
	}
	e := newEnv(t, c)
	bad, good := e.name("Refused"), e.name("Accepted")
	const maxAttempts = 2
	b := e.start(false, nil, []string{bad, good}, func(*endpoint.Endpoints) {}, func(o *outbox.Options) {
		o.MaxAttempts = maxAttempts
	})
	c.Refuse(t, c.TypeTopic(bad))
	ctx := context.Background()
	if err := b.Publish(ctx, Order{}, bus.Headers{bus.HeaderMessageID: e.name("direct"), bus.HeaderMessageType: bad}); err == nil {
		t.Error("a direct Publish the Pub/Sub refused returned no error")
	}
	const n = 10
	isBad := map[string]bool{}
	err := e.db.Transaction(func(tx *gorm.DB) error {
		for i := range 2 * n {
			id, typ := e.name(fmt.Sprintf("row-%02d", i)), good
			if i%2 == 1 {
				typ = bad
				isBad[id] = true
			}
			if err := b.PublishTx(ctx, tx, Order{N: i}, bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: typ}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var rows []*outbox.Message
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err = b.OutboxStore().List(ctx, outbox.Query{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		settled := 0
		for _, m := range rows {
			if m.Status != outbox.StatusPending {
				settled++
			}
		}
		if settled == len(rows) && len(rows) == 2*n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows settled after 30s (a refused row retries after 1s and parks at attempt %d)", settled, 2*n, maxAttempts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, m := range rows {
		switch {
		case isBad[m.MessageID] && m.Status == outbox.StatusDelivered:
			t.Errorf("row %s marked delivered: the Pub/Sub refused it (lost)", m.MessageID)
		case isBad[m.MessageID] && (m.Attempts != maxAttempts || m.LastError == ""):
			t.Errorf("refused row %s: %s after %d attempts (%q), want parked after %d with the reason", m.MessageID, m.Status, m.Attempts, m.LastError, maxAttempts)
		case !isBad[m.MessageID] && (m.Status != outbox.StatusDelivered || m.Attempts != 0):
			t.Errorf("accepted row %s: %s after %d failed attempts (%q), want delivered at once", m.MessageID, m.Status, m.Attempts, m.LastError)
		case isBad[m.MessageID] && m.MessageID == e.name("row-01"):
			t.Logf("a refused row's last error: %s", m.LastError)
		}
	}
}

// stopDrains (issue 33, item 6): Stop waits for the handler in flight,
// whose context stays intact, and its effect commits once. On wmredis the
// handler's context used to be the inner subscription's, canceled the
// moment Stop closed the router: the handler was aborted and the message
// handed back, repeating whatever it had done outside its transaction.
func stopDrains(t *testing.T, c Config) {
	e := newEnv(t, c)
	typ := e.name("OrderPlaced")
	ep := e.name("drain")
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	ctxErr := make(chan error, 1)
	b := e.start(false, []string{ep}, []string{typ}, func(d *endpoint.Endpoints) {
		d.ReceiveEndpoint(ep, func(x *endpoint.Endpoint) {
			x.Retry = endpoint.NoRetry()
			endpoint.Consumer(x, func(ctx context.Context, oc *endpoint.Context[Order]) error {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-release
				ctxErr <- ctx.Err()
				return record(ep)(ctx, oc)
			}, endpoint.AsMessageType(typ))
		})
	})
	id := e.name("in-flight")
	ctx := context.Background()
	if err := b.Publish(ctx, Order{N: 1}, bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: typ}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never started")
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
	case <-time.After(300 * time.Millisecond): // nothing signals that Stop is waiting
	}
	close(release)
	if err := <-ctxErr; err != nil {
		t.Errorf("the in-flight handler's context was canceled while Stop drained: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Stop: %v", err)
	}
	if got := e.effects()[[2]string{ep, id}]; got != 1 {
		t.Errorf("the drained message's effect applied %d times, want 1", got)
	}
}
