// Command backpressure shows what bounds how fast an endpoint consumes: a
// slow consumer (-work per message) on the slow-work endpoint with
// PrefetchCount (-prefetch) and ConcurrentMessageLimit (-concurrency) set.
// POST /burst?n=1000 publishes a burst; GET /stats shows the messages being
// handled right now (never above ConcurrentMessageLimit), the high-water
// mark, what was consumed, and the backlog (on RabbitMQ also the queue's
// ready count, read with a passive queue declare). See README.md for what
// limits what.
//
//	go run ./samples/backpressure -demo   # scripted run, prints and exits
//	go run ./samples/backpressure         # HTTP API on 127.0.0.1:8086
//
// Add -amqp-url and -postgres-dsn to run on RabbitMQ and PostgreSQL, or
// -transport postgres with -postgres-dsn to run on the PostgreSQL transport
// (no broker; see README.md). On the embedded SQLite default every handler runs inside a transaction on the
// database's single connection, so handlers run one at a time; with
// PostgreSQL they run ConcurrentMessageLimit at a time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// WorkItem is one unit of slow work; Burst groups the items of one burst.
type WorkItem struct {
	Burst string `json:"burst"`
	Seq   int    `json:"seq"`
}

const workEndpoint = "slow-work"

// maxBurst bounds POST /burst's n.
const maxBurst = 100_000

// gauge is an in-flight count with its high-water mark.
type gauge struct{ cur, max atomic.Int64 }

func (g *gauge) set(n int64) {
	g.cur.Store(n)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (g *gauge) add(d int64) { g.set(g.cur.Add(d)) }

// burst tracks one POST /burst.
type burst struct {
	ID       string     `json:"id"`
	N        int        `json:"n"`
	Consumed int64      `json:"consumed"`
	Started  time.Time  `json:"started"`
	Finished *time.Time `json:"finished,omitempty"`
	Took     string     `json:"took,omitempty"`
}

// worker is the slow consumer and the bookkeeping around it.
type worker struct {
	work     time.Duration
	inFlight gauge // handlers running right now
	consumed atomic.Int64

	mu     sync.Mutex
	bursts map[string]*burst
	order  []string
	seq    int
}

// Consume implements endpoint.Handler[WorkItem].
func (w *worker) Consume(ctx context.Context, c *endpoint.Context[WorkItem]) error {
	w.inFlight.add(1)
	defer w.inFlight.add(-1)
	select {
	case <-time.After(w.work):
	case <-ctx.Done():
		return ctx.Err()
	}
	w.consumed.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if b := w.bursts[c.Message.Burst]; b != nil { // nil: left in the queue by an earlier run
		b.Consumed++
		if int(b.Consumed) == b.N {
			now := time.Now().UTC()
			b.Finished, b.Took = &now, now.Sub(b.Started).Round(time.Millisecond).String()
		}
	}
	return nil
}

func (w *worker) newBurst(n int) *burst {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	b := &burst{ID: fmt.Sprintf("%s-%d", sample.RunID(), w.seq), N: n, Started: time.Now().UTC()}
	w.bursts[b.ID] = b
	w.order = append(w.order, b.ID)
	return b
}

func (w *worker) burst(id string) burst {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *w.bursts[id]
}

func (w *worker) recent() []burst {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := []burst{}
	for i := len(w.order) - 1; i >= 0 && len(out) < 10; i-- {
		out = append(out, *w.bursts[w.order[i]])
	}
	return out
}

func main() {
	work := flag.Duration("work", 10*time.Millisecond, "time the consumer spends on each message")
	concurrency := flag.Int("concurrency", 5, "the endpoint's ConcurrentMessageLimit")
	prefetch := flag.Int("prefetch", 20, "the endpoint's PrefetchCount (>= -concurrency)")
	demoN := flag.Int("n", 200, "messages the -demo publishes")
	f := sample.ParseFlags("127.0.0.1:8086")
	if *work <= 0 || *demoN <= 0 {
		log.Fatal("-work and -n must be positive")
	}
	w := &worker{work: *work, bursts: map[string]*burst{}}
	declare := func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(workEndpoint, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = *concurrency
			e.PrefetchCount = *prefetch
			endpoint.ConsumerOf[WorkItem](e, w)
		})
	}
	b, err := f.NewBus(declare, nil) // rejects a limit above the prefetch, or negative values
	if err != nil {
		log.Fatal(err)
	}
	ep := b.Endpoints()[0]            // with defaults applied
	held := ep.ConcurrentMessageLimit // deliveries the bus may hold at once
	if ep.BatchEnabled() {
		held *= endpoint.BatchDeliveriesPerHandler // group commit: more waiting for a worker
	}
	a := &app{b: b, w: w, f: f, limit: ep.ConcurrentMessageLimit, held: held, prefetch: ep.PrefetchCount}
	if f.Is(sample.TransportRabbitMQ) {
		a.queue = &queueInspector{url: f.AMQPURL}
		defer a.queue.Close()
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go a.sampleBus(ctx)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /burst", a.postBurst)
	mux.HandleFunc("GET /stats", a.stats)
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, *demoN) }, 5*time.Minute); err != nil {
		stop()
		log.Fatal(err)
	}
}

type app struct {
	b                     *bus.Bus
	w                     *worker
	f                     sample.Flags
	limit, held, prefetch int
	queue                 *queueInspector // RabbitMQ only
	busInFlight           gauge           // the bus's count: messages taken off the queue and not settled
	published             atomic.Int64
}

// sampleBus records the bus's in-flight count every 2ms, for its high-water mark.
func (a *app) sampleBus(ctx context.Context) {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.busInFlight.set(a.b.Stats().InFlight)
		}
	}
}

// publish publishes a burst of n items from 8 goroutines. Each Publish
// returns once the transport accepted the message (on RabbitMQ, once the
// broker confirmed it; RabbitMQ.MaxPendingPublishes caps unconfirmed ones).
func (a *app) publish(ctx context.Context, n int) (*burst, error) {
	bu := a.w.newBurst(n)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			if err := a.b.Publish(ctx, WorkItem{Burst: bu.ID, Seq: i}, nil); err != nil {
				return err
			}
			a.published.Add(1)
			return nil
		})
	}
	return bu, g.Wait()
}

func (a *app) postBurst(w http.ResponseWriter, r *http.Request) {
	n := 1000
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > maxBurst {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("n %q: a whole number from 1 to %d", v, maxBurst))
			return
		}
	}
	start := time.Now()
	bu, err := a.publish(r.Context(), n)
	if err != nil {
		sample.WriteError(w, http.StatusServiceUnavailable, err)
		return
	}
	sample.WriteJSON(w, http.StatusAccepted, map[string]any{
		"burst": bu.ID, "published": n, "publishTook": time.Since(start).Round(time.Millisecond).String(),
		"expectedDrainTime": a.drainEstimate(n).String(),
	})
}

// drainEstimate is n × work ÷ the handlers that can really run at once.
func (a *app) drainEstimate(n int) time.Duration {
	parallel := a.limit
	if !a.f.OnPostgres() {
		parallel = 1 // SQLite's single connection serializes the handlers' transactions
	}
	return (time.Duration(n) * a.w.work / time.Duration(parallel)).Round(time.Millisecond)
}

type statsView struct {
	Transport              string     `json:"transport"`
	PrefetchCount          int        `json:"prefetchCount"`
	ConcurrentMessageLimit int        `json:"concurrentMessageLimit"`
	WorkPerMessage         string     `json:"workPerMessage"`
	InFlight               int64      `json:"inFlight"`
	MaxInFlight            int64      `json:"maxInFlight"`
	BusInFlight            int64      `json:"busInFlight"`
	MaxBusInFlight         int64      `json:"maxBusInFlight"`
	Published              int64      `json:"published"`
	Consumed               int64      `json:"consumed"`
	Backlog                int64      `json:"backlog"`
	Queue                  *queueView `json:"queue,omitempty"`
	Bursts                 []burst    `json:"bursts"`
	Bus                    bus.Stats  `json:"bus"`
}

type queueView struct {
	Name      string `json:"name"`
	Ready     int    `json:"ready"`
	Consumers int    `json:"consumers"`
	// Prefetched counts messages the broker delivered to this process that
	// wait for a free handler (unacknowledged, not in flight).
	Prefetched int64  `json:"prefetched"`
	Error      string `json:"error,omitempty"`
}

func (a *app) snapshot(ctx context.Context) statsView {
	v := statsView{
		Transport: a.f.Transport(), PrefetchCount: a.prefetch, ConcurrentMessageLimit: a.limit,
		WorkPerMessage: a.w.work.String(),
		InFlight:       a.w.inFlight.cur.Load(), MaxInFlight: a.w.inFlight.max.Load(),
		BusInFlight: a.busInFlight.cur.Load(), MaxBusInFlight: a.busInFlight.max.Load(),
		Published: a.published.Load(), Consumed: a.w.consumed.Load(),
		Bursts: a.w.recent(), Bus: a.b.Stats(),
	}
	v.Backlog = max(0, v.Published-v.Consumed-v.BusInFlight)
	if a.queue != nil {
		q := &queueView{Name: workEndpoint}
		ready, consumers, err := a.queue.Inspect(ctx, workEndpoint)
		if err != nil {
			q.Error = err.Error()
		} else {
			q.Ready, q.Consumers = ready, consumers
			q.Prefetched = max(0, v.Published-v.Consumed-int64(ready)-v.BusInFlight)
		}
		v.Queue = q
	}
	return v
}

func (a *app) stats(w http.ResponseWriter, r *http.Request) {
	sample.WriteJSON(w, http.StatusOK, a.snapshot(r.Context()))
}

// demo publishes a burst, prints progress until it is consumed, and checks
// that the concurrency limit held.
func (a *app) demo(ctx context.Context, n int) error {
	fmt.Printf("backpressure on %s: PrefetchCount %d, ConcurrentMessageLimit %d, %v of work per message\n\n",
		a.f.Transport(), a.prefetch, a.limit, a.w.work)
	start := time.Now()
	bu, err := a.publish(ctx, n)
	if err != nil {
		return err
	}
	fmt.Printf("published %d messages in %v; expected drain time about %v\n", n, time.Since(start).Round(time.Millisecond), a.drainEstimate(n))
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for a.w.burst(bu.ID).Finished == nil {
		select {
		case <-ctx.Done():
			return fmt.Errorf("burst not consumed: %w", context.Cause(ctx))
		case <-tick.C:
			s := a.snapshot(ctx)
			line := fmt.Sprintf("  %5.2fs  consumed %4d/%d  in flight %d (bus %d)  backlog %d",
				time.Since(start).Seconds(), a.w.burst(bu.ID).Consumed, n, s.InFlight, s.BusInFlight, s.Backlog)
			if s.Queue != nil && s.Queue.Error == "" {
				line += fmt.Sprintf("  queue ready %d, prefetched %d", s.Queue.Ready, s.Queue.Prefetched)
			}
			fmt.Println(line)
		}
	}
	s := a.snapshot(ctx)
	done := a.w.burst(bu.ID)
	fmt.Printf("\nconsumed %d messages in %s; handlers in flight at most %d, bus in flight at most %d (limit %d)\n\n",
		done.Consumed, done.Took, s.MaxInFlight, s.MaxBusInFlight, a.limit)

	var c sample.Checks
	c.Expect(done.Consumed == int64(n), "all %d messages were consumed", n)
	c.Expect(s.MaxInFlight <= int64(a.limit), "handlers in flight never exceeded ConcurrentMessageLimit %d (max %d)", a.limit, s.MaxInFlight)
	c.Expect(s.MaxBusInFlight <= int64(a.held), "the bus held at most %d deliveries (ConcurrentMessageLimit × %d with group commit; max %d)", a.held, a.held/a.limit, s.MaxBusInFlight)
	if a.f.OnPostgres() {
		c.Expect(s.MaxInFlight == int64(a.limit), "with PostgreSQL the handlers ran %d at a time (max %d)", a.limit, s.MaxInFlight)
	} else {
		c.Expect(s.MaxInFlight == 1, "on SQLite the handlers ran one at a time, serialized on its single connection (max %d)", s.MaxInFlight)
	}
	return c.Err()
}

// queueInspector reads a RabbitMQ queue's ready count and consumer count
// with a passive declare on a connection of its own (the bus does not
// expose queue depths).
type queueInspector struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
}

func (q *queueInspector) Inspect(ctx context.Context, name string) (ready, consumers int, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn == nil || q.conn.IsClosed() {
		conn, err := amqp.DialConfig(q.url, amqp.Config{Properties: amqp.Table{"connection_name": "backpressure queue inspector"}})
		if err != nil {
			return 0, 0, fmt.Errorf("queue inspector: connect: %w", err)
		}
		q.conn = conn
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	ch, err := q.conn.Channel() // a channel per call: a failed passive declare closes it
	if err != nil {
		return 0, 0, fmt.Errorf("queue inspector: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	st, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) {
			return 0, 0, fmt.Errorf("queue inspector: %s", ae.Reason)
		}
		return 0, 0, fmt.Errorf("queue inspector: %w", err)
	}
	return st.Messages, st.Consumers, nil
}

func (q *queueInspector) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn != nil {
		_ = q.conn.Close()
	}
}
