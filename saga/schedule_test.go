package saga_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/inproc"
)

// Payment is the timeout tests' saga: TimeoutToken holds the pending
// PaymentTimeout's message id; Timeouts counts the timeouts applied.
type Payment struct {
	saga.State
	TimeoutToken string `gorm:"size:64"`
	Timeouts     int
}

type PaymentRequested struct{ ID string }
type PaymentDone struct{ ID string }
type PaymentTimeout struct{ ID string }
type PaymentExtended struct{ ID string }
type PaymentBroken struct{ ID string }
type PaymentQuery struct{ ID string }

// PaymentStatus answers PaymentRequested and PaymentQuery sent as requests.
type PaymentStatus struct {
	ID, State string
}

// payWorld is one timeout test's machine, database and buses.
type payWorld struct {
	m       *saga.Machine[Payment]
	delay   time.Duration
	queue   string
	table   string
	prefix  string
	path    string   // SQLite file ("" on PostgreSQL)
	db      *gorm.DB // PostgreSQL
	fired   *atomic.Int64
	states  map[string]saga.StateName
	timeout *saga.Schedule[Payment, PaymentTimeout]
}

func newPayWorld(t *testing.T, backend string, delay time.Duration) *payWorld {
	t.Helper()
	s := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	w := &payWorld{delay: delay, fired: new(atomic.Int64), queue: "payments-" + s, table: "saga_payment_" + s, prefix: "sagapay_" + s + "_", states: map[string]saga.StateName{}}
	switch backend {
	case "sqlite":
		w.path = filepath.Join(t.TempDir(), "bus.db")
	case "postgres":
		db, err := postgresdb.Open(testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		w.db = db
		t.Cleanup(func() {
			for _, tbl := range []string{w.table, w.prefix + "inbox", w.prefix + "outbox"} {
				db.Exec(`DROP TABLE IF EXISTS "` + tbl + `"`)
			}
			if sqlDB, err := db.DB(); err == nil {
				_ = sqlDB.Close()
			}
		})
	}
	if err := w.build(); err != nil {
		t.Fatal(err)
	}
	return w
}

// build defines w's machine.
func (w *payWorld) build() error {
	m, err := saga.New("payment", func(m *saga.Machine[Payment]) {
		awaiting, paid, timedOut, extended := m.State("Awaiting"), m.State("Paid"), m.State("TimedOut"), m.State("Extended")
		w.states["Awaiting"], w.states["Paid"], w.states["TimedOut"], w.states["Extended"] = awaiting, paid, timedOut, extended
		requested := saga.NewEvent(m, func(e PaymentRequested) string { return e.ID })
		done := saga.NewEvent(m, func(e PaymentDone) string { return e.ID })
		timeoutEv := saga.NewEvent(m, func(e PaymentTimeout) string { return e.ID })
		extend := saga.NewEvent(m, func(e PaymentExtended) string { return e.ID })
		broken := saga.NewEvent(m, func(e PaymentBroken) string { return e.ID })
		query := saga.NewEvent(m, func(e PaymentQuery) string { return e.ID })
		w.timeout = saga.NewSchedule(m, timeoutEv, func(p *Payment) *string { return &p.TimeoutToken }, w.delay)
		status := func(c *saga.Context[Payment, PaymentQuery]) any {
			return PaymentStatus{ID: c.Message.ID, State: c.State().CurrentState}
		}
		m.Initially(
			saga.When(requested).
				Schedule(w.timeout, func(c *saga.Context[Payment, PaymentRequested]) any { return PaymentTimeout{ID: c.Message.ID} }).
				TransitionTo(awaiting).
				Respond(func(c *saga.Context[Payment, PaymentRequested]) any {
					return PaymentStatus{ID: c.Message.ID, State: c.State().CurrentState}
				}),
			saga.When(broken).
				Schedule(w.timeout, func(c *saga.Context[Payment, PaymentBroken]) any { return PaymentTimeout{ID: c.Message.ID} }).
				TransitionTo(awaiting).
				Then(func(ctx context.Context, c *saga.Context[Payment, PaymentBroken]) error {
					return endpoint.Permanent(errors.New("card declined"))
				}),
		)
		m.During(awaiting,
			saga.When(done).TransitionTo(paid), // leaves Awaiting: the timeout is cancelled
			saga.When(timeoutEv).Then(func(ctx context.Context, c *saga.Context[Payment, PaymentTimeout]) error {
				w.fired.Add(1)
				c.Instance.Timeouts++
				return nil
			}).TransitionTo(timedOut),
			// Stays in Awaiting: Unschedule cancels, Schedule sets a new one.
			saga.When(extend).Unschedule(w.timeout).
				Schedule(w.timeout, func(c *saga.Context[Payment, PaymentExtended]) any { return PaymentTimeout{ID: c.Message.ID} }),
		)
		m.DuringAny(saga.When(query).Respond(status))
	}, saga.WithTable(w.table), saga.OnUnhandled(saga.IgnoreUnhandled))
	if err != nil {
		return err
	}
	w.m = m
	return nil
}

func (w *payWorld) start(t *testing.T) *bus.Bus {
	t.Helper()
	b, err := w.newBus()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.Stop(ctx)
	})
	if err := saga.Migrate(ctx, b.DB(), w.m); err != nil {
		t.Fatal(err)
	}
	return b
}

func (w *payWorld) newBus() (*bus.Bus, error) {
	opts := []bus.Option{quiet(), bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint(w.queue, func(e *endpoint.Endpoint) { saga.Register(e, w.m) })
	}))}
	if w.path != "" {
		opts = append(opts, bus.WithSQLite(w.path))
	} else {
		opts = append(opts, bus.WithDatabase(w.db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = w.prefix }))
	}
	return bus.New(opts...)
}

// waitState waits until instance id is in state.
func (w *payWorld) waitState(t *testing.T, b *bus.Bus, id string, state saga.StateName) *Payment {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := w.m.Get(context.Background(), b.DB(), id)
		if err == nil && p.CurrentState == string(state) {
			return p
		}
		if err != nil && !errors.Is(err, saga.ErrNotFound) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s not in %s within 30s (now %+v, %v)", id, state, p, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func scheduled(t *testing.T, b *bus.Bus) []*outbox.Message {
	t.Helper()
	rows, err := b.OutboxStore().List(context.Background(), outbox.Query{Scheduled: true})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func send(t *testing.T, b *bus.Bus, queue string, msg any) {
	t.Helper()
	if err := b.Send(context.Background(), queue, msg, nil); err != nil {
		t.Fatal(err)
	}
}

func backends(t *testing.T, run func(t *testing.T, backend string)) {
	for _, be := range []string{"sqlite", "postgres"} {
		t.Run(be, func(t *testing.T) { run(t, be) })
	}
}

// TestTimeoutFiresOnce: a scheduled timeout arrives after its delay, moves
// the saga once and clears the token; nothing stays scheduled.
func TestTimeoutFiresOnce(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		w := newPayWorld(t, backend, 300*time.Millisecond)
		b := w.start(t)
		began := time.Now()
		send(t, b, w.queue, PaymentRequested{ID: "p1"})
		// (TestEventBeforeTimeoutCancelsIt checks the scheduled row and
		// the token while the timeout waits.)
		p := w.waitState(t, b, "p1", w.states["TimedOut"])
		if took := time.Since(began); took < w.delay {
			t.Errorf("the timeout arrived %v after the request; the delay is %v", took, w.delay)
		}
		if p.Timeouts != 1 || p.TimeoutToken != "" || w.fired.Load() != 1 {
			t.Errorf("after the timeout: Timeouts=%d token=%q fired=%d; want 1, empty, 1", p.Timeouts, p.TimeoutToken, w.fired.Load())
		}
		if rows := scheduled(t, b); len(rows) != 0 {
			t.Errorf("%d rows still scheduled", len(rows))
		}
	})
}

// TestEventBeforeTimeoutCancelsIt: an event that moves the saga on before
// the timeout is due cancels the scheduled message in its transaction; a
// timeout that arrives anyway (the cancel lost the race with the relay, or
// one with a stale id) is ignored.
func TestEventBeforeTimeoutCancelsIt(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		w := newPayWorld(t, backend, time.Hour)
		b := w.start(t)
		send(t, b, w.queue, PaymentRequested{ID: "p2"})
		p := w.waitState(t, b, "p2", w.states["Awaiting"])
		token := p.TimeoutToken
		if rows := scheduled(t, b); len(rows) != 1 || rows[0].MessageID != token {
			t.Fatalf("scheduled rows = %d; want one with id %s", len(rows), token)
		}
		send(t, b, w.queue, PaymentDone{ID: "p2"})
		p = w.waitState(t, b, "p2", w.states["Paid"])
		if p.TimeoutToken != "" {
			t.Errorf("token = %q after Paid; want it cleared", p.TimeoutToken)
		}
		if rows := scheduled(t, b); len(rows) != 0 {
			t.Errorf("%d rows still scheduled after Paid; want the timeout cancelled", len(rows))
		}
		// The lost race: the timeout with the old token arrives after all.
		before := settledConsumed(t, b)
		if err := b.Send(context.Background(), w.queue, PaymentTimeout{ID: "p2"}, bus.Headers{bus.HeaderMessageID: token}); err != nil {
			t.Fatal(err)
		}
		waitConsumed(t, b, before+1)
		if p := w.waitState(t, b, "p2", w.states["Paid"]); p.Timeouts != 0 || w.fired.Load() != 0 {
			t.Errorf("a stale timeout was applied: Timeouts=%d fired=%d", p.Timeouts, w.fired.Load())
		}

		// Extend (same state): the old timeout is cancelled, a new one
		// replaces it; a timeout carrying the old id is ignored, the new
		// one is applied.
		send(t, b, w.queue, PaymentRequested{ID: "p3"})
		old := w.waitState(t, b, "p3", w.states["Awaiting"]).TimeoutToken
		before = settledConsumed(t, b)
		send(t, b, w.queue, PaymentExtended{ID: "p3"})
		waitConsumed(t, b, before+1)
		p = w.waitState(t, b, "p3", w.states["Awaiting"])
		if p.TimeoutToken == "" || p.TimeoutToken == old {
			t.Fatalf("token after Extend = %q (old %q); want a new one", p.TimeoutToken, old)
		}
		if rows := scheduled(t, b); len(rows) != 1 || rows[0].MessageID != p.TimeoutToken {
			t.Fatalf("scheduled rows = %d after Extend; want only the new timeout", len(rows))
		}
		before = settledConsumed(t, b)
		if err := b.Send(context.Background(), w.queue, PaymentTimeout{ID: "p3"}, bus.Headers{bus.HeaderMessageID: old}); err != nil {
			t.Fatal(err)
		}
		waitConsumed(t, b, before+1)
		if w.fired.Load() != 0 {
			t.Fatal("the replaced timeout was applied")
		}
		// The current one, delivered early by hand, is applied once.
		if err := b.Send(context.Background(), w.queue, PaymentTimeout{ID: "p3"}, bus.Headers{bus.HeaderMessageID: p.TimeoutToken}); err != nil {
			t.Fatal(err)
		}
		p = w.waitState(t, b, "p3", w.states["TimedOut"])
		if p.Timeouts != 1 || w.fired.Load() != 1 || p.TimeoutToken != "" {
			t.Errorf("Timeouts=%d fired=%d token=%q; want 1, 1, empty", p.Timeouts, w.fired.Load(), p.TimeoutToken)
		}
	})
}

// settledConsumed returns Stats().Consumed once no delivery is held: a
// message's effect can be visible before the bus counts it consumed (the
// count follows the commit and the ack), so a count read right after
// waiting for an effect may still miss that message.
func settledConsumed(t *testing.T, b *bus.Bus) int64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for b.Stats().InFlight != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries still held after 30s", b.Stats().InFlight)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b.Stats().Consumed
}

func waitConsumed(t *testing.T, b *bus.Bus, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for b.Stats().Consumed < n {
		if time.Now().After(deadline) {
			t.Fatalf("consumed %d of %d within 30s", b.Stats().Consumed, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestTimeoutAfterRestart: the bus that scheduled the timeout stops before
// it is due; a new bus on the same database (SQLite file or PostgreSQL)
// delivers it once and the saga moves.
func TestTimeoutAfterRestart(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		w := newPayWorld(t, backend, 2*time.Second)
		b1 := w.start(t)
		began := time.Now()
		send(t, b1, w.queue, PaymentRequested{ID: "p4"})
		token := w.waitState(t, b1, "p4", w.states["Awaiting"]).TimeoutToken
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := b1.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if time.Since(began) >= w.delay {
			t.Skip("the first bus took longer than the delay to stop; the machine is too slow for this test")
		}
		if w.fired.Load() != 0 {
			t.Fatal("the timeout fired before the restart")
		}
		b2 := w.start(t)
		p := w.waitState(t, b2, "p4", w.states["TimedOut"])
		if time.Since(began) < w.delay {
			t.Errorf("the timeout arrived before its delay")
		}
		if p.Timeouts != 1 || w.fired.Load() != 1 {
			t.Errorf("Timeouts=%d fired=%d; want 1", p.Timeouts, w.fired.Load())
		}
		// The same message again (a redelivery) is a duplicate for the inbox.
		before := b2.Stats().Duplicates
		if err := b2.Send(context.Background(), w.queue, PaymentTimeout{ID: "p4"}, bus.Headers{bus.HeaderMessageID: token}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for b2.Stats().Duplicates == before {
			if time.Now().After(deadline) {
				t.Fatal("the redelivered timeout was not skipped as a duplicate within 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if p, err := w.m.Get(context.Background(), b2.DB(), "p4"); err != nil || p.Timeouts != 1 {
			t.Errorf("after the redelivery: %+v, %v; want Timeouts 1", p, err)
		}
	})
}

// TestScheduleThenFailLeavesNothing: a transition that schedules a timeout
// and then fails leaves no instance and no scheduled message.
func TestScheduleThenFailLeavesNothing(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		w := newPayWorld(t, backend, time.Hour)
		b := w.start(t)
		send(t, b, w.queue, PaymentBroken{ID: "p5"})
		deadline := time.Now().Add(30 * time.Second)
		for b.Stats().DeadLettered < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the failing transition was not dead-lettered within 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := w.m.Get(context.Background(), b.DB(), "p5"); !errors.Is(err, saga.ErrNotFound) {
			t.Errorf("Get after the failed transition: %v; want ErrNotFound", err)
		}
		if rows := scheduled(t, b); len(rows) != 0 {
			t.Errorf("%d rows scheduled by a transition that failed", len(rows))
		}
		// Neighbours keep flowing.
		send(t, b, w.queue, PaymentRequested{ID: "p6"})
		w.waitState(t, b, "p6", w.states["Awaiting"])
	})
}

// TestSagaRespond: a saga answers requests sent with bus.Request, from the
// transition that starts it and from a later one, in the transition's
// transaction; the same event published (not a request) gets no response
// and still moves the saga.
func TestSagaRespond(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		w := newPayWorld(t, backend, time.Hour)
		b := w.start(t)
		ctx := context.Background()
		got, err := bus.Request[PaymentStatus](ctx, b, w.queue, PaymentRequested{ID: "r1"}, bus.WithRequestTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if got != (PaymentStatus{ID: "r1", State: "Awaiting"}) {
			t.Errorf("response to PaymentRequested = %+v", got)
		}
		got, err = bus.Request[PaymentStatus](ctx, b, w.queue, PaymentQuery{ID: "r1"}, bus.WithRequestTimeout(30*time.Second))
		if err != nil || got != (PaymentStatus{ID: "r1", State: "Awaiting"}) {
			t.Errorf("response to PaymentQuery = %+v, %v", got, err)
		}
		// Not a request: no response, the transition still happens.
		send(t, b, w.queue, PaymentRequested{ID: "r2"})
		w.waitState(t, b, "r2", w.states["Awaiting"])
		// A request whose transition fails is answered with a fault.
		_, err = bus.Request[PaymentStatus](ctx, b, w.queue, PaymentBroken{ID: "r3"}, bus.WithRequestTimeout(30*time.Second))
		var fault *bus.RequestFaultError
		if !errors.As(err, &fault) {
			t.Errorf("request whose transition fails: %v; want a RequestFaultError", err)
		}
	})
}

// TestScheduleDefinitionErrors: mistakes in schedules are definition
// errors from saga.New, reported together.
func TestScheduleDefinitionErrors(t *testing.T) {
	_, err := saga.New("bad", func(m *saga.Machine[Payment]) {
		a := m.State("A")
		ev := saga.NewEvent(m, func(e PaymentTimeout) string { return e.ID })
		other := saga.NewEvent(m, func(e PaymentDone) string { return e.ID })
		started := saga.NewEvent(m, func(e PaymentRequested) string { return e.ID })
		tok := func(p *Payment) *string { return &p.TimeoutToken }
		s := saga.NewSchedule(m, ev, tok, time.Minute)
		saga.NewSchedule(m, ev, tok, time.Minute)
		saga.NewSchedule[Payment, PaymentTimeout](m, nil, tok, time.Minute)
		saga.NewSchedule(m, other, nil, time.Minute)
		saga.NewSchedule(m, other, tok, 0)
		saga.NewSchedule(m, other, func(*Payment) *string { return nil }, time.Minute)
		m.Initially(
			saga.When(started).Schedule(s, nil).TransitionTo(a),
			saga.When(started).Schedule(nil, func(*saga.Context[Payment, PaymentRequested]) any { return nil }),
			saga.When(started).Unschedule(nil),
			saga.When(started).Respond(nil),
		)
	})
	for _, want := range []string{
		`NewSchedule(PaymentTimeout): the event is already a schedule`,
		`NewSchedule: the event is nil`,
		`NewSchedule(PaymentDone): the token function is nil`,
		`NewSchedule(PaymentDone): delay 0s must be within 1ms-`,
		`NewSchedule(PaymentDone): the token function returned nil`,
		`When(PaymentRequested).Schedule: the schedule and the message function are required`,
		`When(PaymentRequested).Unschedule: the schedule is nil`,
		`When(PaymentRequested).Respond: function is nil`,
	} {
		if !errors.Is(err, saga.ErrInvalidMachine) || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

type wrongTimeout struct{ ID string }

// TestScheduleWrongMessageType: a Schedule step whose function returns
// another type than the schedule's event fails the event permanently (it is
// dead-lettered with the reason), and neighbours keep flowing.
func TestScheduleWrongMessageType(t *testing.T) {
	s := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	queue := "wrongtype-" + s
	faults := make(chan string, 4)
	m, err := saga.New("wrongtype", func(m *saga.Machine[Payment]) {
		a := m.State("A")
		ev := saga.NewEvent(m, func(e PaymentTimeout) string { return e.ID })
		started := saga.NewEvent(m, func(e PaymentRequested) string { return e.ID })
		done := saga.NewEvent(m, func(e PaymentDone) string { return e.ID })
		sch := saga.NewSchedule(m, ev, func(p *Payment) *string { return &p.TimeoutToken }, time.Minute)
		m.Initially(
			saga.When(started).Schedule(sch, func(c *saga.Context[Payment, PaymentRequested]) any { return wrongTimeout{ID: c.Message.ID} }).TransitionTo(a),
			saga.When(done).TransitionTo(a),
		)
	}, saga.WithTable("saga_wrongtype_"+s))
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.New(quiet(), bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) { saga.Register(e, m) })
		c.ReceiveEndpoint(queue+"_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				select {
				case faults <- d.Headers["BW-Fault-Reason"]:
				default:
				}
				return nil
			})
		})
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Stop(ctx) }()
	if err := saga.Migrate(ctx, b.DB(), m); err != nil {
		t.Fatal(err)
	}
	send(t, b, queue, PaymentRequested{ID: "w1"})
	select {
	case reason := <-faults:
		if !strings.Contains(reason, "returned saga_test.wrongTimeout, not the schedule's event type") {
			t.Errorf("fault reason %q", reason)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the event was not dead-lettered within 30s")
	}
	send(t, b, queue, PaymentDone{ID: "w2"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p, err := m.Get(ctx, b.DB(), "w2"); err == nil && p.CurrentState == "A" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the next event was not applied within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := m.Get(ctx, b.DB(), "w1"); !errors.Is(err, saga.ErrNotFound) {
		t.Errorf("w1: %v; want no instance", err)
	}
}

// TestTimeoutAfterSIGKILL: a child process (this test binary, re-run)
// starts the saga, which schedules its timeout, and is killed with SIGKILL
// before the timeout is due; a bus started afterwards on the same database
// delivers the timeout once and the saga moves.
func TestTimeoutAfterSIGKILL(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		// Far enough ahead for a child built with -race to start on a busy
		// machine; the test skips if it still was not.
		w := newPayWorld(t, backend, 6*time.Second)
		env := []string{"BW_SAGA_CHILD=1", "BW_SAGA_QUEUE=" + w.queue, "BW_SAGA_TABLE=" + w.table,
			"BW_SAGA_PREFIX=" + w.prefix, "BW_SAGA_PATH=" + w.path, "BW_SAGA_DELAY=" + w.delay.String()}
		if w.db != nil {
			env = append(env, "BW_SAGA_DSN="+testenv.PostgresDSN(t))
		}
		began := time.Now()
		testenv.KillChildWhenReady(t, env...)
		if time.Since(began) > w.delay-500*time.Millisecond {
			t.Skipf("the child took %v to schedule; the machine is too slow for this test", time.Since(began))
		}
		b := w.start(t)
		if p, err := w.m.Get(context.Background(), b.DB(), "k1"); err != nil || p.CurrentState != "Awaiting" || p.TimeoutToken == "" {
			t.Fatalf("after the kill: %+v, %v; want Awaiting with a token", p, err)
		}
		p := w.waitState(t, b, "k1", w.states["TimedOut"])
		if time.Since(began) < w.delay {
			t.Errorf("the timeout arrived %v after the child started; the delay is %v", time.Since(began), w.delay)
		}
		if p.Timeouts != 1 || w.fired.Load() != 1 || p.TimeoutToken != "" {
			t.Errorf("Timeouts=%d fired=%d token=%q; want 1, 1, empty", p.Timeouts, w.fired.Load(), p.TimeoutToken)
		}
		if rows := scheduled(t, b); len(rows) != 0 {
			t.Errorf("%d rows still scheduled", len(rows))
		}
	})
}

// sagaChild is the child of TestTimeoutAfterSIGKILL: it starts instance
// k1, which schedules its timeout, says "scheduled" and waits to be killed.
func sagaChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "saga child:", err)
		os.Exit(2)
	}
	delay, err := time.ParseDuration(os.Getenv("BW_SAGA_DELAY"))
	if err != nil {
		fail(err)
	}
	w := &payWorld{delay: delay, fired: new(atomic.Int64), queue: os.Getenv("BW_SAGA_QUEUE"), table: os.Getenv("BW_SAGA_TABLE"),
		prefix: os.Getenv("BW_SAGA_PREFIX"), path: os.Getenv("BW_SAGA_PATH"), states: map[string]saga.StateName{}}
	if dsn := os.Getenv("BW_SAGA_DSN"); dsn != "" {
		if w.db, err = postgresdb.Open(dsn); err != nil {
			fail(err)
		}
	}
	if err := w.build(); err != nil {
		fail(err)
	}
	b, err := w.newBus()
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		fail(err)
	}
	if err := saga.Migrate(ctx, b.DB(), w.m); err != nil {
		fail(err)
	}
	if err := b.Send(ctx, w.queue, PaymentRequested{ID: "k1"}, nil); err != nil {
		fail(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p, err := w.m.Get(ctx, b.DB(), "k1"); err == nil && p.CurrentState == "Awaiting" {
			break
		}
		if time.Now().After(deadline) {
			fail(fmt.Errorf("instance k1 not in Awaiting within 60s"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	testenv.SignalReadyAndWait()
}
