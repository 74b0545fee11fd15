//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/tcpproxy"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// TestInteractions is the randomized interaction profile (issue 33): three
// bus instances in this process on the real RabbitMQ and PostgreSQL, whose
// handlers publish, send, request, schedule and overrun their timeout,
// while a producer publishes (and re-publishes) orders, a canceller cancels
// scheduled reminders, and a seeded schedule stops and restarts instances,
// drops their broker connections and cuts PostgreSQL off, all at random
// moments. One destination nacks everything sent to it (a full
// reject-publish queue). The checker then requires, within a bound:
//
//   - every committed order billed once, invoiced once, audited once when
//     asked, its reminder delivered once or, when CancelScheduled said
//     true, never; its slow step applied once despite the timeout;
//   - every send to the nacking queue parked with the broker's reason,
//     never delivered, and nothing else left pending or parked;
//   - every Stop returned within its deadline plus stopBound, and every
//     request a handler made returned within its timeout plus a second.
//
// BAREWIRE_INTERACTIONS_SEED replays a schedule (each run prints its seed),
// BAREWIRE_INTERACTIONS_DURATION sets the load time (20s; `make
// reliability PROFILE=interactions` runs 5 minutes). What it does not do
// yet: separate processes, SIGSTOP of an instance, sagas.
func TestInteractions(t *testing.T) {
	seed, _ := strconv.ParseUint(os.Getenv("BAREWIRE_INTERACTIONS_SEED"), 10, 64)
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with BAREWIRE_INTERACTIONS_SEED=%d)", seed, seed)
	duration := 20 * time.Second
	if d, err := time.ParseDuration(os.Getenv("BAREWIRE_INTERACTIONS_DURATION")); err == nil && d > 0 {
		duration = d
	}
	ix := newInteractions(t, seed)
	ix.run(duration)
	ix.check()
}

const (
	stopDeadline = 5 * time.Second
	stopBound    = 3 * time.Second // beyond Stop's deadline
	requestLimit = 3 * time.Second
	settleBound  = 90 * time.Second // for everything to reach its terminal state after the load
	instances    = 3
)

// ixOrder is the producer's message; what billing does with it is decided
// here, by the seeded schedule, so that a retried handler does the same.
type ixOrder struct {
	ID       string `json:"id"`
	Audit    bool   `json:"audit"`
	RemindMs int    `json:"remindMs"` // 0: no reminder
	Sink     bool   `json:"sink"`     // also send to the queue that nacks everything
	Slow     bool   `json:"slow"`     // also send a step whose first attempt overruns its timeout
	Request  bool   `json:"request"`  // the invoice asks pricing, from inside a consumer
}

type ixInvoice struct {
	ID      string `json:"id"`
	Request bool   `json:"request"`
}
type ixReminder struct{ ID string }
type ixStep struct{ ID string }
type ixPrice struct{ ID string }
type ixPriceReply struct{ ID string }

type interactions struct {
	t      *testing.T
	seed   uint64
	rng    *rand.Rand
	sfx    string
	url    string
	db     *gorm.DB // direct, for the checker
	pgx    *tcpproxy.Proxy
	dbs    []*gorm.DB // through the proxy, one per instance slot
	prefix string
	names  map[string]string

	mu     sync.Mutex
	buses  [instances]*bus.Bus
	orders map[string]ixOrder // committed

	stopTimes  []time.Duration
	requests   atomic.Int64
	slowReqs   atomic.Int64
	reqErrs    sync.Map // error text → count
	slowFirsts sync.Map // step id → first attempt seen
}

func newInteractions(t *testing.T, seed uint64) *interactions {
	dsn := testenv.PostgresDSN(t)
	url := testenv.AMQPURL(t)
	sfx := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	ix := &interactions{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), sfx: sfx, url: url,
		prefix: "ix_" + sfx + "_", orders: map[string]ixOrder{}, names: map[string]string{}}
	for _, n := range []string{"billing", "audit", "invoicing", "pricing", "reminders", "slow", "sink", "Order", "Invoice", "Reminder", "Step", "Price"} {
		ix.names[n] = "ix-" + n + "-" + sfx
	}
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ix.db = db
	ix.pgx, err = tcpproxy.New(testenv.PostgresAddr(dsn))
	if err != nil {
		t.Fatal(err)
	}
	proxied := testenv.PostgresDSNVia(dsn, ix.pgx.Addr())
	for range instances {
		pdb, err := postgresdb.Open(proxied)
		if err != nil {
			t.Fatal(err)
		}
		ix.dbs = append(ix.dbs, pdb)
	}
	if err := db.Exec(`CREATE TABLE ` + ix.prefix + `effects (id bigserial PRIMARY KEY, endpoint text NOT NULL, message_id text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`CREATE TABLE ` + ix.prefix + `orders (id text PRIMARY KEY)`).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`CREATE TABLE ` + ix.prefix + `cancels (message_id text PRIMARY KEY)`).Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ix.pgx.Up()
		ix.mu.Lock()
		for i, b := range ix.buses {
			if b != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_ = b.Stop(ctx)
				cancel()
				ix.buses[i] = nil
			}
		}
		ix.mu.Unlock()
		for _, tbl := range []string{"effects", "orders", "cancels", "inbox", "outbox"} {
			db.Exec(`DROP TABLE IF EXISTS ` + ix.prefix + tbl)
		}
		ix.deleteQueues()
		for _, d := range append(ix.dbs, db) {
			if s, err := d.DB(); err == nil {
				_ = s.Close()
			}
		}
		ix.pgx.Close()
	})
	for i := range instances {
		ix.startBus(i)
	}
	ix.fillSink()
	return ix
}

// fillSink puts the one message the nacking queue holds, so that it
// refuses everything the handlers send it.
func (ix *interactions) fillSink() {
	conn, err := amqp.Dial(ix.url)
	if err != nil {
		ix.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		ix.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		ix.t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", ix.names["sink"], true, false, amqp.Publishing{Body: []byte("fill")})
	if err != nil || !dc.Wait() {
		ix.t.Fatalf("fill the nacking queue: %v", err)
	}
}

// startBus starts the instance in slot i.
func (ix *interactions) startBus(i int) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		b := ix.newBus(i)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := b.Start(ctx)
		cancel()
		if err == nil {
			ix.mu.Lock()
			ix.buses[i] = b
			ix.mu.Unlock()
			return
		}
		// PostgreSQL may be cut off right now; a bus runs once, so the
		// next try builds another.
		if time.Now().After(deadline) {
			ix.t.Errorf("instance %d did not start within 60s: %v", i, err) // not Fatal: called from the chaos goroutine too
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// newBus builds the instance of slot i.
func (ix *interactions) newBus(i int) *bus.Bus {
	t, n := ix.t, ix.names
	b, err := bus.New(
		bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		bus.WithInstanceID(fmt.Sprintf("ix-%s-%d-%d", ix.sfx, i, time.Now().UnixNano())),
		bus.WithStopTimeout(stopDeadline),
		bus.WithDatabase(ix.dbs[i]),
		bus.WithOutbox(func(o *outbox.Options) {
			o.TablePrefix = ix.prefix
			o.MaxAttempts = 2
			o.PollingInterval = 200 * time.Millisecond
			o.InboxLockTimeout = 3 * time.Second
		}),
		bus.WithTransport(rabbitmq.New(ix.url, func(c *rabbitmq.Config) {
			c.PublishTimeout = 2 * time.Second
			c.Topology.DeclareQueue(endpoint.Queue{Name: n["sink"], MaxLength: 1, Overflow: "reject-publish"})
			c.ReceiveEndpoint(n["billing"], func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, ix.billing, endpoint.AsMessageType(n["Order"]))
			})
			c.ReceiveEndpoint(n["audit"], func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, recordOf[ixOrder](ix, n["audit"]), endpoint.AsMessageType(n["Order"]+".audit"))
			})
			c.ReceiveEndpoint(n["invoicing"], func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, ix.invoicing, endpoint.AsMessageType(n["Invoice"]))
			})
			c.ReceiveEndpoint(n["pricing"], func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ixPrice]) error {
					return c.Respond(ctx, ixPriceReply{ID: c.Message.ID})
				}, endpoint.AsMessageType(n["Price"]))
			})
			c.ReceiveEndpoint(n["reminders"], func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, recordOf[ixReminder](ix, n["reminders"]), endpoint.AsMessageType(n["Reminder"]))
			})
			c.ReceiveEndpoint(n["slow"], func(e *endpoint.Endpoint) {
				e.HandlerTimeout = 300 * time.Millisecond
				e.Retry = endpoint.Immediate(3)
				endpoint.Consumer(e, ix.slow, endpoint.AsMessageType(n["Step"]))
			})
		})),
	)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (ix *interactions) record(ctx context.Context, endpointName, id string) error {
	return bus.TxFromContext(ctx).Exec(`INSERT INTO `+ix.prefix+`effects (endpoint, message_id) VALUES (?, ?)`, endpointName, id).Error
}

// recordOf returns a consumer that records its effect and nothing else.
func recordOf[T any](ix *interactions, endpointName string) func(context.Context, *endpoint.Context[T]) error {
	return func(ctx context.Context, c *endpoint.Context[T]) error {
		return ix.record(ctx, endpointName, c.MessageID)
	}
}

func (ix *interactions) billing(ctx context.Context, c *endpoint.Context[ixOrder]) error {
	n, o := ix.names, c.Message
	if err := ix.record(ctx, n["billing"], c.MessageID); err != nil {
		return err
	}
	if err := c.Publish(ctx, ixInvoice{ID: o.ID, Request: o.Request}, endpoint.Headers{bus.HeaderMessageType: n["Invoice"], bus.HeaderMessageID: "inv-" + o.ID}); err != nil {
		return err
	}
	if o.Audit {
		if err := c.Send(ctx, "queue:"+n["audit"], o, endpoint.Headers{bus.HeaderMessageType: n["Order"] + ".audit", bus.HeaderMessageID: "aud-" + o.ID}); err != nil {
			return err
		}
	}
	if o.RemindMs > 0 {
		h := bus.Delay(time.Duration(o.RemindMs)*time.Millisecond, bus.Headers{bus.HeaderMessageType: n["Reminder"], bus.HeaderMessageID: "rem-" + o.ID})
		if err := c.Send(ctx, "queue:"+n["reminders"], ixReminder{ID: o.ID}, h); err != nil {
			return err
		}
	}
	if o.Sink {
		if err := c.Send(ctx, "queue:"+n["sink"], o, endpoint.Headers{bus.HeaderMessageType: n["Order"] + ".sink", bus.HeaderMessageID: "sink-" + o.ID}); err != nil {
			return err
		}
	}
	if o.Slow {
		if err := c.Send(ctx, "queue:"+n["slow"], ixStep{ID: o.ID}, endpoint.Headers{bus.HeaderMessageType: n["Step"], bus.HeaderMessageID: "step-" + o.ID}); err != nil {
			return err
		}
	}
	return nil
}

func (ix *interactions) invoicing(ctx context.Context, c *endpoint.Context[ixInvoice]) error {
	if c.Message.Request {
		b := ix.anyBus()
		if b != nil {
			began := time.Now()
			_, err := bus.Request[ixPriceReply](ctx, b, "queue:"+ix.names["pricing"], ixPrice{ID: c.Message.ID},
				bus.WithRequestTimeout(requestLimit), bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: ix.names["Price"]}))
			ix.requests.Add(1)
			if time.Since(began) > requestLimit+time.Second {
				ix.slowReqs.Add(1)
			}
			if err != nil {
				if errorClass(err) == "other" {
					ix.t.Logf("a request from a consumer failed: %v", err)
				}
				v, _ := ix.reqErrs.LoadOrStore(errorClass(err), new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
			}
		}
	}
	return ix.record(ctx, ix.names["invoicing"], c.MessageID)
}

// errorClass names a request error's kind for the report.
func errorClass(err error) string {
	switch {
	case errors.Is(err, bus.ErrStopping):
		return "stopping"
	case errors.Is(err, bus.ErrRequestTimeout):
		return "timeout"
	case errors.Is(err, bus.ErrNotStarted):
		return "not started"
	case errors.Is(err, outbox.ErrTransportUnavailable):
		return "transport unavailable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context"
	}
	return "other"
}

// slow overruns its 300ms HandlerTimeout on a step's first attempt in this
// process, then succeeds.
func (ix *interactions) slow(ctx context.Context, c *endpoint.Context[ixStep]) error {
	if _, seen := ix.slowFirsts.LoadOrStore(c.MessageID, true); !seen {
		<-ctx.Done()
		return ctx.Err()
	}
	return ix.record(ctx, ix.names["slow"], c.MessageID)
}

// anyBus returns a running instance, or nil.
func (ix *interactions) anyBus() *bus.Bus {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var up []*bus.Bus
	for _, b := range ix.buses {
		if b != nil {
			up = append(up, b)
		}
	}
	if len(up) == 0 {
		return nil
	}
	return up[int(time.Now().UnixNano())%len(up)]
}

// run drives the load and the chaos for d.
func (ix *interactions) run(d time.Duration) {
	t := ix.t
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The schedule is drawn up front, so that a seed replays it.
	type fault struct {
		at   time.Duration
		kind string
		slot int
		hold time.Duration
	}
	var faults []fault
	for at := time.Duration(0); ; {
		at += time.Duration(800+ix.rng.IntN(2200)) * time.Millisecond
		if at > d-2*time.Second {
			break
		}
		kinds := []string{"stop-restart", "drop-connection", "pg-outage"}
		faults = append(faults, fault{at: at, kind: kinds[ix.rng.IntN(len(kinds))], slot: ix.rng.IntN(instances),
			hold: time.Duration(500+ix.rng.IntN(1500)) * time.Millisecond})
	}
	type plan struct {
		order     ixOrder
		republish bool
		cancelMs  int
	}
	var plans []plan
	for i := range int(d / (25 * time.Millisecond)) {
		o := ixOrder{ID: fmt.Sprintf("o-%s-%05d", ix.sfx, i), Audit: ix.rng.IntN(3) == 0, Sink: ix.rng.IntN(20) == 0,
			Slow: ix.rng.IntN(10) == 0, Request: ix.rng.IntN(6) == 0}
		p := plan{order: o, republish: ix.rng.IntN(20) == 0}
		if ix.rng.IntN(3) == 0 {
			p.order.RemindMs = 300 + ix.rng.IntN(1200)
			if ix.rng.IntN(2) == 0 {
				p.cancelMs = ix.rng.IntN(p.order.RemindMs + 300)
			}
		}
		plans = append(plans, p)
	}
	t.Logf("schedule: %d orders over %v, %d faults", len(plans), d, len(faults))

	began := time.Now()
	wg.Go(func() { // the producer
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for _, p := range plans {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			b := ix.anyBus()
			if b == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			h := bus.Headers{bus.HeaderMessageType: ix.names["Order"], bus.HeaderMessageID: p.order.ID}
			err := b.Transaction(ctx, func(tx *gorm.DB) error {
				if err := tx.Exec(`INSERT INTO `+ix.prefix+`orders (id) VALUES (?)`, p.order.ID).Error; err != nil {
					return err
				}
				return b.PublishTx(ctx, tx, p.order, h)
			})
			cancel()
			if err != nil {
				continue // not committed (PostgreSQL cut off, an instance stopping): nothing to check
			}
			ix.mu.Lock()
			ix.orders[p.order.ID] = p.order
			ix.mu.Unlock()
			if p.republish {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = b.Publish(ctx, p.order, h) // the same id again, straight to the broker
				cancel()
			}
			if p.cancelMs > 0 {
				id := "rem-" + p.order.ID
				wg.Go(func() {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(p.cancelMs) * time.Millisecond):
					}
					ix.cancel(id)
				})
			}
		}
	})
	wg.Go(func() { // the chaos
		for _, f := range faults {
			select {
			case <-stop:
				return
			case <-time.After(time.Until(began.Add(f.at))):
			}
			switch f.kind {
			case "stop-restart":
				ix.mu.Lock()
				b := ix.buses[f.slot]
				ix.buses[f.slot] = nil
				ix.mu.Unlock()
				if b == nil {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), stopDeadline)
				s := time.Now()
				_ = b.Stop(ctx)
				took := time.Since(s)
				cancel()
				ix.mu.Lock()
				ix.stopTimes = append(ix.stopTimes, took)
				ix.mu.Unlock()
				ix.startBus(f.slot)
			case "drop-connection":
				ix.mu.Lock()
				b := ix.buses[f.slot]
				ix.mu.Unlock()
				if b != nil {
					_ = b.DropConnection()
				}
			case "pg-outage":
				ix.pgx.Down()
				time.Sleep(f.hold)
				ix.pgx.Up()
			}
		}
	})
	time.Sleep(d)
	close(stop)
	wg.Wait()
	ix.pgx.Up()
	ix.mu.Lock()
	t.Logf("load done after %v: %d orders committed, %d stops", time.Since(began).Round(time.Millisecond), len(ix.orders), len(ix.stopTimes))
	ix.mu.Unlock()
}

// cancel cancels a reminder in a transaction that records the cancel, so
// that only a committed true counts.
func (ix *interactions) cancel(id string) {
	b := ix.anyBus()
	if b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.Transaction(ctx, func(tx *gorm.DB) error {
		ok, err := b.CancelScheduledTx(ctx, tx, id)
		if err != nil || !ok {
			return err
		}
		return tx.Exec(`INSERT INTO `+ix.prefix+`cancels (message_id) VALUES (?)`, id).Error
	})
}

// check waits for every message to reach its terminal state and reports
// what did not.
func (ix *interactions) check() {
	t := ix.t
	ix.mu.Lock()
	orders := make(map[string]ixOrder, len(ix.orders))
	for k, v := range ix.orders {
		orders[k] = v
	}
	stops := append([]time.Duration(nil), ix.stopTimes...)
	ix.mu.Unlock()
	n := ix.names
	var problems []string
	deadline := time.Now().Add(settleBound)
	for {
		effects := map[[2]string]int{}
		var rows []struct {
			Endpoint, MessageID string
			N                   int
		}
		if err := ix.db.Raw(`SELECT endpoint, message_id, count(*) AS n FROM ` + ix.prefix + `effects GROUP BY endpoint, message_id`).Scan(&rows).Error; err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			effects[[2]string{r.Endpoint, r.MessageID}] = r.N
		}
		var cancelled []string
		if err := ix.db.Raw(`SELECT message_id FROM ` + ix.prefix + `cancels`).Scan(&cancelled).Error; err != nil {
			t.Fatal(err)
		}
		isCancelled := map[string]bool{}
		for _, id := range cancelled {
			isCancelled[id] = true
		}
		problems = problems[:0]
		want := func(ep, id string, count int) {
			if got := effects[[2]string{n[ep], id}]; got != count {
				problems = append(problems, fmt.Sprintf("%s %s: %d effects, want %d", ep, id, got, count))
			}
		}
		for _, o := range orders {
			want("billing", o.ID, 1)
			want("invoicing", "inv-"+o.ID, 1)
			if o.Audit {
				want("audit", "aud-"+o.ID, 1)
			}
			if o.Slow {
				want("slow", "step-"+o.ID, 1)
			}
			if o.RemindMs > 0 {
				if isCancelled["rem-"+o.ID] {
					want("reminders", "rem-"+o.ID, 0) // CancelScheduled said true: it must never leave
				} else {
					want("reminders", "rem-"+o.ID, 1)
				}
			}
		}
		var left []struct {
			MessageID, Status, LastError string
		}
		if err := ix.db.Raw(`SELECT message_id, status, last_error FROM ` + ix.prefix + `outbox WHERE status <> 'delivered'`).Scan(&left).Error; err != nil {
			t.Fatal(err)
		}
		for _, r := range left {
			sink := strings.HasPrefix(r.MessageID, "sink-")
			switch {
			case sink && r.Status == "parked" && strings.Contains(r.LastError, "nack"):
			case sink && r.Status == "parked":
				problems = append(problems, fmt.Sprintf("outbox %s parked with %q, want the broker's nack", r.MessageID, r.LastError))
			default:
				problems = append(problems, fmt.Sprintf("outbox %s still %s (%s)", r.MessageID, r.Status, r.LastError))
			}
		}
		var delivered []string
		if err := ix.db.Raw(`SELECT message_id FROM ` + ix.prefix + `outbox WHERE status = 'delivered' AND message_id LIKE 'sink-%'`).Scan(&delivered).Error; err != nil {
			t.Fatal(err)
		}
		for _, id := range delivered {
			problems = append(problems, fmt.Sprintf("outbox %s to the nacking queue marked delivered", id))
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i, p := range problems {
		if i == 20 {
			t.Errorf("... and %d more", len(problems)-20)
			break
		}
		t.Error(p)
	}
	for _, d := range stops {
		if d > stopDeadline+stopBound {
			t.Errorf("a Stop took %v, over its %v deadline plus %v", d, stopDeadline, stopBound)
		}
	}
	if n := ix.slowReqs.Load(); n > 0 {
		t.Errorf("%d requests from consumers took longer than their %v timeout plus 1s", n, requestLimit)
	}
	reqErrs := map[string]int64{}
	ix.reqErrs.Range(func(k, v any) bool { reqErrs[k.(string)] = v.(*atomic.Int64).Load(); return true })
	var longest time.Duration
	for _, d := range stops {
		longest = max(longest, d)
	}
	t.Logf("checked %d orders; %d stops (longest %v); %d requests from consumers (errors by kind: %v); problems: %d",
		len(orders), len(stops), longest.Round(time.Millisecond), ix.requests.Load(), reqErrs, len(problems))
	if t.Failed() {
		t.Logf("replay with BAREWIRE_INTERACTIONS_SEED=%d", ix.seed)
	}
}

func (ix *interactions) deleteQueues() {
	conn, err := amqp.Dial(ix.url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for k, v := range ix.names {
		if k[0] >= 'a' && k[0] <= 'z' { // endpoints and queues; types are exchanges
			_, _ = ch.QueueDelete(v, false, false, false)
			_, _ = ch.QueueDelete(v+"_error", false, false, false)
		} else {
			_ = ch.ExchangeDelete(v, false, false)
		}
	}
}
