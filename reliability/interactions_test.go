//go:build linux

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// TestInteractions is the randomized interaction profile (issue 33): three
// bus instances in this process on the real RabbitMQ and PostgreSQL, each
// reaching both through TCP proxies of its own, whose handlers publish,
// send, request, schedule and overrun their timeout, and a saga that asks
// two endpoints in turn and times out when their answer is late or never
// comes, while a producer publishes (and re-publishes) orders, a canceller
// cancels scheduled reminders, and a seeded schedule stops and restarts
// instances, drops their broker connections, cuts PostgreSQL off, and
// freezes one instance (its database and broker traffic held at its
// proxies past InboxLockTimeout, its broker connections cut so that its
// unacknowledged messages go to the others, then thawed: its transactions
// resume after others took their messages over), all at random moments.
// One destination nacks everything sent to it (a full reject-publish
// queue). The checker then requires, within a bound:
//
//   - every committed order (as the orders table says, whatever the
//     producer was told) billed once, invoiced once, audited once when
//     asked, its reminder delivered once or, when CancelScheduled said
//     true, never; its slow step applied once despite the timeout;
//   - every saga it started in Completed or TimedOut, its completion side
//     effect written once, payments asked once and shipping once if it got
//     past the payment; Completed only when both answer;
//   - every send to the nacking queue parked with the broker's reason,
//     never delivered, nothing else left pending or parked, and nothing
//     dead-lettered;
//   - every Stop returned within its deadline plus stopBound, and every
//     request a handler made returned within its timeout plus a second.
//
// BAREWIRE_INTERACTIONS_SEED replays a schedule (each run prints its seed),
// BAREWIRE_INTERACTIONS_DURATION sets the load time (20s; `make
// reliability PROFILE=interactions` runs 5 minutes). The freeze is an
// in-process stand-in for SIGSTOP: the frozen instance's own timers keep
// running (its statements with a deadline give up, its probes find the
// database down). What it does not do: separate processes, and a
// PostgreSQL restart; the multi-process profiles (TestReliability and
// TestReliabilityPostgresTransport) cover both: stop-cont SIGSTOPs a real
// consumer process past InboxLockTimeout, and pg-restart restarts
// PostgreSQL (when enabled, as `make reliability` does).
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
	stopDeadline  = 5 * time.Second
	stopBound     = 3 * time.Second // beyond Stop's deadline
	requestLimit  = 3 * time.Second
	settleBound   = 90 * time.Second // for everything to reach its terminal state after the load
	instances     = 3
	ixLockTimeout = 3 * time.Second // the buses' InboxLockTimeout; a freeze outlasts it
)

// The faults of the seeded schedule.
var ixFaultKinds = []string{"stop-restart", "drop-connection", "pg-outage", "freeze"}

// ixOrder is the producer's message; what billing does with it is decided
// here, by the seeded schedule, so that a retried handler does the same.
type ixOrder struct {
	ID       string `json:"id"`
	Audit    bool   `json:"audit"`
	RemindMs int    `json:"remindMs"` // 0: no reminder
	Sink     bool   `json:"sink"`     // also send to the queue that nacks everything
	Slow     bool   `json:"slow"`     // also send a step whose first attempt overruns its timeout
	Request  bool   `json:"request"`  // the invoice asks pricing, from inside a consumer
	Saga     bool   `json:"saga"`     // also start a saga (see interactions_saga_test.go)
	PayMs    int    `json:"payMs"`    // its payment answers after this long; -1: never
	ShipMs   int    `json:"shipMs"`   // its shipment answers after this long; -1: never
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
	t       *testing.T
	seed    uint64
	rng     *rand.Rand
	sfx     string
	url     string
	db      *gorm.DB // direct, for the checker
	machine *saga.Machine[ixSaga]
	prefix  string
	names   map[string]string
	// Each instance slot reaches PostgreSQL and RabbitMQ through proxies
	// of its own, so that one instance can be frozen or cut off alone.
	pgx  [instances]*tcpproxy.Proxy
	mqx  [instances]*tcpproxy.Proxy
	dbs  [instances]*gorm.DB // through pgx, one per slot
	urls [instances]string   // through mqx
	// lost counts, per slot, the attempts whose inbox lock had been taken
	// over by another delivery when they came to commit (the bus logs
	// each at debug level): a frozen instance's late commits, refused.
	lost [instances]atomic.Int64

	mu        sync.Mutex
	buses     [instances]*bus.Bus
	frozen    [instances]bool
	planned   map[string]ixOrder // every order the producer tried
	committed int                // orders whose commit the producer saw succeed

	faults     map[string]int // done, by kind
	freezes    []string       // what each freeze caught, for the log
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
		prefix: "ix_" + sfx + "_", planned: map[string]ixOrder{}, names: map[string]string{}, faults: map[string]int{}}
	for _, n := range []string{"billing", "audit", "invoicing", "pricing", "reminders", "slow", "sink", "saga", "payments", "shipping",
		"Order", "Invoice", "Reminder", "Step", "Price", "SagaStart", "SagaPaid", "SagaShipped", "SagaTimeout", "PayRequest", "ShipRequest"} {
		ix.names[n] = "ix-" + n + "-" + sfx
	}
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ix.db = db
	t.Cleanup(func() {
		for i := range instances {
			if ix.pgx[i] != nil {
				ix.pgx[i].Up()
				ix.pgx[i].Thaw()
			}
			if ix.mqx[i] != nil {
				ix.mqx[i].Thaw()
			}
		}
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
		for _, tbl := range []string{"effects", "orders", "cancels", "sagas", "sagadone", "inbox", "outbox"} {
			db.Exec(`DROP TABLE IF EXISTS ` + ix.prefix + tbl)
		}
		ix.deleteQueues()
		for _, d := range append(ix.dbs[:], db) {
			if d == nil {
				continue
			}
			if s, err := d.DB(); err == nil {
				_ = s.Close()
			}
		}
		for i := range instances {
			for _, p := range []*tcpproxy.Proxy{ix.pgx[i], ix.mqx[i]} {
				if p != nil {
					p.Close()
				}
			}
		}
	})
	for i := range instances {
		if ix.pgx[i], err = tcpproxy.New(testenv.PostgresAddr(dsn)); err != nil {
			t.Fatal(err)
		}
		// The application name tells the slot's sessions apart in
		// pg_stat_activity (see freeze).
		proxied := testenv.PostgresDSNVia(dsn, ix.pgx[i].Addr()) + " application_name=" + ix.appName(i)
		if ix.dbs[i], err = postgresdb.Open(proxied); err != nil {
			t.Fatal(err)
		}
		if ix.mqx[i], ix.urls[i], err = tcpproxy.ForURL(url); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{
		`CREATE TABLE ` + ix.prefix + `effects (id bigserial PRIMARY KEY, endpoint text NOT NULL, message_id text NOT NULL)`,
		`CREATE TABLE ` + ix.prefix + `orders (id text PRIMARY KEY)`,
		`CREATE TABLE ` + ix.prefix + `cancels (message_id text PRIMARY KEY)`,
		// No key: a side effect written twice must show.
		`CREATE TABLE ` + ix.prefix + `sagadone (id bigserial PRIMARY KEY, order_id text NOT NULL, outcome text NOT NULL, from_state text NOT NULL)`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	if ix.machine, err = ix.newMachine(); err != nil {
		t.Fatal(err)
	}
	if err := saga.Migrate(context.Background(), db, ix.machine); err != nil {
		t.Fatal(err)
	}
	for i := range instances {
		ix.startBus(i)
	}
	ix.fillSink()
	return ix
}

// appName is the PostgreSQL application_name of slot i's sessions.
func (ix *interactions) appName(i int) string { return fmt.Sprintf("ix-%s-%d", ix.sfx, i) }

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
		bus.WithLogger(slog.New(lockLostCounter{&ix.lost[i]})),
		bus.WithInstanceID(fmt.Sprintf("ix-%s-%d-%d", ix.sfx, i, time.Now().UnixNano())),
		bus.WithStopTimeout(stopDeadline),
		bus.WithDatabase(ix.dbs[i]),
		bus.WithOutbox(func(o *outbox.Options) {
			o.TablePrefix = ix.prefix
			o.MaxAttempts = 2
			o.PollingInterval = 200 * time.Millisecond
			o.InboxLockTimeout = ixLockTimeout
		}),
		bus.WithTransport(rabbitmq.New(ix.urls[i], func(c *rabbitmq.Config) {
			c.PublishTimeout = 2 * time.Second
			c.Topology.DeclareQueue(endpoint.Queue{Name: n["sink"], MaxLength: 1, Overflow: "reject-publish"})
			c.ReceiveEndpoint(n["billing"], func(e *endpoint.Endpoint) {
				// One transaction per message: the inbox's lock is
				// fenced by its token at the commit, so a frozen
				// handler's entry can be taken over before the thaw.
				// The other endpoints group-commit (the default), whose
				// transaction holds its entries' rows from its start.
				e.Batch.MaxMessages = 1
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
			c.ReceiveEndpoint(n["saga"], func(e *endpoint.Endpoint) { saga.Register(e, ix.machine) })
			c.ReceiveEndpoint(n["payments"], func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, answer(ix, n["payments"], "pay-", n["SagaPaid"], "paid-", func(id string) ixSagaPaid { return ixSagaPaid{ID: id} }),
					endpoint.AsMessageType(n["PayRequest"]))
			})
			c.ReceiveEndpoint(n["shipping"], func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, answer(ix, n["shipping"], "ship-", n["SagaShipped"], "shipped-", func(id string) ixSagaShipped { return ixSagaShipped{ID: id} }),
					endpoint.AsMessageType(n["ShipRequest"]))
			})
		})),
	)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lockLostCounter is the buses' log handler: it drops every record and
// counts those that say an attempt found its inbox lock taken over by
// another delivery when it came to commit.
type lockLostCounter struct{ n *atomic.Int64 }

func (h lockLostCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h lockLostCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "inbox lock taken over by another delivery") {
		h.n.Add(1)
	}
	return nil
}
func (h lockLostCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h lockLostCounter) WithGroup(string) slog.Handler      { return h }

// record writes a handler's effect in its transaction. The comment names
// the endpoint in pg_stat_activity, where freeze looks for a handler
// between its effect and its commit.
func (ix *interactions) record(ctx context.Context, endpointName, id string) error {
	return bus.TxFromContext(ctx).Exec(`/* `+endpointName+` */ INSERT INTO `+ix.prefix+`effects (endpoint, message_id) VALUES (?, ?)`, endpointName, id).Error
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
	if o.Saga {
		start := ixSagaStart{ID: o.ID, PayMs: o.PayMs, ShipMs: o.ShipMs}
		if err := c.Send(ctx, "queue:"+n["saga"], start, endpoint.Headers{bus.HeaderMessageType: n["SagaStart"], bus.HeaderMessageID: "sst-" + o.ID}); err != nil {
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
	case errors.Is(err, bus.ErrStopping), errors.Is(err, bus.ErrStopped):
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

// anyBus returns a running instance that is not frozen, or nil.
func (ix *interactions) anyBus() *bus.Bus {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var up []*bus.Bus
	for i, b := range ix.buses {
		if b != nil && !ix.frozen[i] {
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
	// Every kind once, in a seeded order, then drawn at random.
	first := ix.rng.Perm(len(ixFaultKinds))
	for at := time.Duration(0); ; {
		at += time.Duration(800+ix.rng.IntN(2200)) * time.Millisecond
		if at > d-2*time.Second {
			break
		}
		kind := ixFaultKinds[ix.rng.IntN(len(ixFaultKinds))]
		if len(faults) < len(first) {
			kind = ixFaultKinds[first[len(faults)]]
		}
		faults = append(faults, fault{at: at, kind: kind, slot: ix.rng.IntN(instances),
			hold: time.Duration(500+ix.rng.IntN(1500)) * time.Millisecond})
	}
	type plan struct {
		order     ixOrder
		republish bool
		cancelMs  int
	}
	var plans []plan
	sagas := 0
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
		if ix.rng.IntN(4) == 0 {
			p.order.Saga, p.order.PayMs, p.order.ShipMs = true, sagaPlan(ix.rng), sagaPlan(ix.rng)
			sagas++
		}
		plans = append(plans, p)
		ix.planned[o.ID] = p.order
	}
	t.Logf("schedule: %d orders over %v (%d with a saga), %d faults", len(plans), d, sagas, len(faults))

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
				// Most did not commit (PostgreSQL cut off, an instance
				// stopping or frozen); the checker reads the orders table
				// for those that did all the same.
				continue
			}
			ix.mu.Lock()
			ix.committed++
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
			ix.mu.Lock()
			ix.faults[f.kind]++
			ix.mu.Unlock()
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
				for _, p := range ix.pgx {
					p.Down()
				}
				time.Sleep(f.hold)
				for _, p := range ix.pgx {
					p.Up()
				}
			case "freeze":
				ix.freeze(f.slot, ixLockTimeout+f.hold)
			}
		}
	})
	time.Sleep(d)
	close(stop)
	wg.Wait()
	ix.mu.Lock()
	t.Logf("load done after %v: %d orders committed as the producer saw it, %d stops, faults by kind %v",
		time.Since(began).Round(time.Millisecond), ix.committed, len(ix.stopTimes), ix.faults)
	for _, f := range ix.freezes {
		t.Log(f)
	}
	ix.mu.Unlock()
}

// freeze is the in-process stand-in for SIGSTOP of the instance in slot:
// its database and broker traffic stop at its proxies (nothing is closed:
// the server keeps its sessions and their open transactions), its broker
// connections are cut so that the broker gives its unacknowledged messages
// to the other instances, which take the inbox locks over once they expire
// (InboxLockTimeout), and after hold (longer than that) everything flows
// again: its handlers resume their transactions, whose late commits the
// inbox must refuse where another delivery took over. The freeze is tried
// again (up to 40 times, 50ms apart) until it catches a billing handler
// between its effect and its commit, as the multi-process stop-cont
// fault tries to catch a handler mid-transaction.
func (ix *interactions) freeze(slot int, hold time.Duration) {
	ix.mu.Lock()
	ix.frozen[slot] = true // no new work from the producer, the canceller or a request
	ix.mu.Unlock()
	effects := func() int64 {
		var n int64
		ix.db.Raw(`SELECT count(*) FROM ` + ix.prefix + `effects`).Scan(&n)
		return n
	}
	before := effects()
	// Frozen, the slot's sessions stay as the server shows them: open
	// transactions, and billing handlers that wrote their effect and have
	// not committed (billing's transaction sends its inbox mark with its
	// COMMIT, so the last statement it ran is the effect's).
	var open, caught, tries int
	for tries = 1; ; tries++ {
		ix.pgx[slot].Freeze()
		ix.mqx[slot].Freeze()
		var r struct{ Open, Caught int }
		if err := ix.db.Raw(`SELECT count(*) AS open, count(*) FILTER (WHERE query LIKE ?) AS caught
FROM pg_stat_activity WHERE application_name = ? AND xact_start IS NOT NULL`,
			"/* "+ix.names["billing"]+" */%", ix.appName(slot)).Scan(&r).Error; err != nil {
			ix.t.Logf("freeze: read pg_stat_activity: %v", err)
		}
		open, caught = r.Open, r.Caught
		if caught > 0 || tries == 40 {
			break
		}
		ix.mqx[slot].Thaw()
		ix.pgx[slot].Thaw()
		time.Sleep(50 * time.Millisecond)
	}
	cut := ix.mqx[slot].Cut()
	time.Sleep(hold)
	during := effects() - before
	// The others' sessions still waiting on a lock now wait on the frozen
	// instance's transactions (a group commit's entries, a saga row).
	var waiting int
	if err := ix.db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE ? AND application_name <> ? AND wait_event_type = 'Lock'`,
		"ix-"+ix.sfx+"-%", ix.appName(slot)).Scan(&waiting).Error; err != nil {
		ix.t.Logf("freeze: read pg_stat_activity: %v", err)
	}
	ix.mqx[slot].Thaw()
	ix.pgx[slot].Thaw()
	ix.mu.Lock()
	ix.frozen[slot] = false
	ix.freezes = append(ix.freezes, fmt.Sprintf("freeze: instance %d for %v with %d transactions open, %d of them billing handlers past their effect (try %d); %d broker connections cut; the others committed %d effects meanwhile, %d of their sessions waited on a lock at the thaw",
		slot, hold.Round(time.Millisecond), open, caught, tries, cut, during, waiting))
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
	stops := append([]time.Duration(nil), ix.stopTimes...)
	committed := ix.committed
	ix.mu.Unlock()
	// The committed orders are those in the orders table: a commit whose
	// answer the producer lost (PostgreSQL cut off at the COMMIT) counts.
	var ids []string
	if err := ix.db.Raw(`SELECT id FROM ` + ix.prefix + `orders`).Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	orders := make(map[string]ixOrder, len(ids))
	for _, id := range ids {
		o, ok := ix.planned[id]
		if !ok {
			t.Fatalf("order %s in the orders table was never planned", id)
		}
		orders[id] = o
	}
	n := ix.names
	var problems []string
	var outcomes map[string]int
	deadline := time.Now().Add(settleBound)
	settled := time.Now()
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
		problems, outcomes = ix.checkSagas(orders, effects, problems)
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	settledIn := time.Since(settled)
	// Nothing may be dead-lettered: every handler succeeds in the end,
	// and a saga event its state does not handle is a doubled or
	// misrouted one.
	dead, err := ix.deadLetters()
	if err != nil {
		t.Error(err)
	}
	for q, d := range dead {
		problems = append(problems, fmt.Sprintf("dead-lettered to %s: %s", q, d))
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
	sagas := 0
	for _, o := range orders {
		if o.Saga {
			sagas++
		}
	}
	var lost [instances]int64
	for i := range lost {
		lost[i] = ix.lost[i].Load()
	}
	ix.mu.Lock()
	faults := maps.Clone(ix.faults)
	ix.mu.Unlock()
	t.Logf("checked %d orders (%d committed as the producer saw it) within %v of the load's end; faults by kind %v; %d stops (longest %v); %d requests from consumers (errors by kind: %v); %d sagas, by terminal state %v; attempts that found their inbox lock taken over, per instance: %v; problems: %d",
		len(orders), committed, settledIn.Round(100*time.Millisecond), faults, len(stops), longest.Round(time.Millisecond), ix.requests.Load(), reqErrs,
		sagas, outcomes, lost, len(problems))
	if t.Failed() {
		t.Logf("replay with BAREWIRE_INTERACTIONS_SEED=%d", ix.seed)
	}
}

// deadLetters describes the messages in the endpoints' error queues: how
// many, and the first few with their message id and fault reason.
func (ix *interactions) deadLetters() (map[string]string, error) {
	conn, err := amqp.Dial(ix.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	out := map[string]string{}
	for k, v := range ix.names {
		if k[0] < 'a' || k[0] > 'z' || k == "sink" {
			continue // a message type, or the nacking queue, no endpoint
		}
		ch, err := conn.Channel()
		if err != nil {
			return out, err
		}
		q, err := ch.QueueDeclarePassive(v+"_error", false, false, false, false, nil)
		if err != nil {
			return out, fmt.Errorf("error queue of %s: %w", k, err)
		}
		if q.Messages > 0 {
			var first []string
			for range min(q.Messages, 10) {
				d, ok, err := ch.Get(q.Name, false)
				if err != nil || !ok {
					break
				}
				first = append(first, fmt.Sprintf("%s (%v, %v attempts): %v", d.MessageId, d.Type, d.Headers["BW-Fault-Attempts"], d.Headers["BW-Fault-Reason"]))
			}
			out[q.Name] = fmt.Sprintf("%d messages, the first: %s", q.Messages, strings.Join(first, "; "))
		}
		_ = ch.Close()
	}
	return out, nil
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
