package saga_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// Counter is the test saga: N counts the events applied to it.
type Counter struct {
	saga.State
	N int
}

type Started struct{ ID string }
type Bumped struct{ ID, Key string }
type Failing struct{ ID string }
type Stopped struct{ ID string }

// Noted is what a bump publishes; a second endpoint records each one.
type Noted struct{ ID, Key string }

type note struct {
	MessageID     string `gorm:"primaryKey;size:200"`
	Key           string
	CorrelationID string
}

// world is one test's saga, its tables and its buses.
type world struct {
	m        *saga.Machine[Counter]
	db       *gorm.DB // the buses' shared database (nil: each bus's own embedded one)
	table    string
	notes    string
	prefix   string
	attempts atomic.Int64 // bump steps run, re-applies after conflicts included
	faults   chan string

	// On RabbitMQ the queues and the Bumped type get names of their own.
	amqpURL       string
	sagas, notesQ string
	bumpedType    string
	retries       int // the saga endpoint's immediate retries
}

func backend(pg bool) string {
	if pg {
		return "postgres"
	}
	return "sqlite"
}

func quiet() bus.Option { return bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))) }

// newWorld makes a world on backend: "sqlite" (each bus's embedded
// database), "postgres" (the in-process transport, tables in PostgreSQL)
// or "rabbitmq" (RabbitMQ, tables in PostgreSQL).
func newWorld(t *testing.T, backend string, opts ...saga.Option) *world {
	t.Helper()
	s := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	w := &world{table: "saga_counter_" + s, notes: "saga_notes_" + s, prefix: "sagat_" + s + "_", faults: make(chan string, 16),
		sagas: "sagas", notesQ: "notes", bumpedType: "Bumped", retries: 10}
	if backend == "rabbitmq" {
		w.amqpURL = testenv.AMQPURL(t)
		w.sagas, w.notesQ, w.bumpedType = "sagas-"+s, "notes-"+s, "Bumped-"+s
		t.Cleanup(func() {
			conn, err := amqp.Dial(w.amqpURL)
			if err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			for _, q := range []string{w.sagas, w.sagas + "_error", w.notesQ, w.notesQ + "_error"} {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
			_ = ch.ExchangeDelete(w.bumpedType, false, false)
		})
	}
	if backend != "sqlite" {
		db, err := postgresdb.Open(testenv.PostgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		w.db = db
		t.Cleanup(func() {
			for _, tbl := range []string{w.table, w.notes, w.prefix + "inbox", w.prefix + "outbox"} {
				db.Exec(`DROP TABLE IF EXISTS "` + tbl + `"`)
			}
			if sqlDB, err := db.DB(); err == nil {
				_ = sqlDB.Close()
			}
		})
	}
	m, err := saga.New("counter", func(m *saga.Machine[Counter]) {
		active := m.State("Active")
		started := saga.NewEvent(m, func(e Started) string { return e.ID })
		bumped := saga.NewEvent(m, func(e Bumped) string { return e.ID }, endpoint.AsMessageType(w.bumpedType))
		failing := saga.NewEvent(m, func(e Failing) string { return e.ID })
		stopped := saga.NewEvent(m, func(e Stopped) string { return e.ID })
		bump := func(b *saga.EventBehavior[Counter, Bumped]) *saga.EventBehavior[Counter, Bumped] {
			return b.Then(func(ctx context.Context, c *saga.Context[Counter, Bumped]) error {
				w.attempts.Add(1)
				c.Instance.N++
				return nil
			}).Publish(func(c *saga.Context[Counter, Bumped]) any { return Noted{ID: c.Message.ID, Key: c.Message.Key} })
		}
		m.Initially(
			saga.When(started).TransitionTo(active),
			bump(saga.When(bumped)).TransitionTo(active),
		)
		m.During(active,
			bump(saga.When(bumped)),
			saga.When(failing).
				Publish(func(c *saga.Context[Counter, Failing]) any { return Noted{ID: c.Message.ID, Key: "from-failing"} }).
				Then(func(ctx context.Context, c *saga.Context[Counter, Failing]) error {
					c.Instance.N += 100
					return endpoint.Permanent(errors.New("payment provider refused"))
				}),
			saga.When(stopped).
				Send(w.notesQ, func(c *saga.Context[Counter, Stopped]) any { return Noted{ID: c.Message.ID, Key: "sent"} }).
				Finalize(),
		)
		m.Finally(func(ctx context.Context, c *saga.Context[Counter, any]) error {
			if c.State().CurrentState != string(saga.Final) {
				return fmt.Errorf("Finally ran in state %s", c.State().CurrentState)
			}
			return c.Publish(ctx, Noted{ID: c.State().CorrelationID, Key: "finally"}, nil)
		})
	}, append([]saga.Option{saga.WithTable(w.table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	w.m = m
	return w
}

func (w *world) declare(c *endpoint.Endpoints) {
	c.ReceiveEndpoint(w.sagas, func(e *endpoint.Endpoint) {
		saga.Register(e, w.m)
		e.Retry = endpoint.Immediate(w.retries)
	})
	c.ReceiveEndpoint(w.notesQ, func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[Noted]) error {
			return bus.TxFromContext(ctx).Table(w.notes).Create(&note{MessageID: c.MessageID, Key: c.Message.Key, CorrelationID: c.CorrelationID}).Error
		})
	})
	c.ReceiveEndpoint(w.sagas+"_error", func(e *endpoint.Endpoint) {
		endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
			select { // never block the error queue's consumer (and Stop) on a full channel
			case w.faults <- d.Headers["BW-Fault-Reason"]:
			default:
			}
			return nil
		})
	})
}

// start runs a bus on w's database (or its own embedded one) and migrates.
func (w *world) start(t *testing.T) *bus.Bus {
	t.Helper()
	opts := []bus.Option{quiet(), bus.WithTransport(inproc.New(func(c *inproc.Config) { w.declare(&c.Endpoints) }))}
	if w.amqpURL != "" {
		opts = []bus.Option{quiet(), bus.WithTransport(rabbitmq.New(w.amqpURL, func(c *rabbitmq.Config) { w.declare(&c.Endpoints) }))}
	}
	if w.db != nil {
		opts = append(opts, bus.WithDatabase(w.db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = w.prefix }))
	}
	b, err := bus.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Bounded: a failed test may leave handlers in flight.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = b.Stop(ctx)
	})
	if w.db == nil {
		w.db = b.DB()
	}
	if err := saga.Migrate(ctx, w.db, w.m); err != nil {
		t.Fatal(err)
	}
	if err := w.db.Table(w.notes).AutoMigrate(&note{}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (w *world) publish(t *testing.T, b *bus.Bus, msg any, id string) {
	t.Helper()
	h := bus.Headers{bus.HeaderMessageID: id}
	if _, ok := msg.(Bumped); ok {
		h[bus.HeaderMessageType] = w.bumpedType
	}
	if err := b.Publish(context.Background(), msg, h); err != nil {
		t.Fatal(err)
	}
}

// settled waits until the buses have settled n deliveries of the saga and
// notes endpoints (consumed, skipped as duplicates, or dead-lettered).
func settled(t *testing.T, n int64, bs ...*bus.Bus) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var got int64
		for _, b := range bs {
			s := b.Stats()
			got += s.Consumed + s.Duplicates + s.DeadLettered
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d deliveries settled within 90s", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *world) get(t *testing.T, id string) *Counter {
	t.Helper()
	c, err := w.m.Get(context.Background(), w.db, id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (w *world) noteKeys(t *testing.T) []string {
	t.Helper()
	var ns []note
	if err := w.db.Table(w.notes).Order("key").Find(&ns).Error; err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(ns))
	for i, n := range ns {
		keys[i] = n.Key
	}
	return keys
}

func modes(t *testing.T, run func(t *testing.T, pg bool, opts ...saga.Option)) {
	for _, db := range []string{"sqlite", "postgres"} {
		for _, mode := range []string{"optimistic", "pessimistic"} {
			t.Run(db+"/"+mode, func(t *testing.T) {
				var opts []saga.Option
				if mode == "pessimistic" {
					opts = append(opts, saga.Pessimistic())
				}
				run(t, db == "postgres", opts...)
			})
		}
	}
}

// TestRedeliveredEventAppliesOnce: the same event (same message id)
// published again after its transition committed changes nothing and
// publishes nothing.
func TestRedeliveredEventAppliesOnce(t *testing.T) {
	modes(t, func(t *testing.T, pg bool, opts ...saga.Option) {
		w := newWorld(t, backend(pg), opts...)
		b := w.start(t)
		id := "c-" + uuid.NewString()
		w.publish(t, b, Bumped{ID: id, Key: "a"}, "m1")
		settled(t, 2, b) // the bump and its note
		w.publish(t, b, Bumped{ID: id, Key: "a"}, "m1")
		settled(t, 3, b)
		if err := b.Send(context.Background(), w.sagas, Bumped{ID: id, Key: "a"}, bus.Headers{bus.HeaderMessageID: "m1", bus.HeaderMessageType: w.bumpedType}); err != nil {
			t.Fatal(err)
		}
		settled(t, 4, b)
		if s := b.Stats(); s.Duplicates != 2 {
			t.Errorf("duplicates = %d, want 2", s.Duplicates)
		}
		c := w.get(t, id)
		if c.N != 1 || c.Version != 1 || c.CurrentState != "Active" {
			t.Errorf("instance after a re-published event: N=%d version=%d state=%s, want 1, 1, Active", c.N, c.Version, c.CurrentState)
		}
		if keys := w.noteKeys(t); len(keys) != 1 {
			t.Errorf("notes %v, want one", keys)
		}
		// The event carried no correlation-id: what the transition
		// published carries the instance's.
		var n note
		if err := w.db.Table(w.notes).Take(&n).Error; err != nil || n.CorrelationID != id {
			t.Errorf("published note's correlation id %q (%v), want the instance's %q", n.CorrelationID, err, id)
		}
	})
}

// TestFailingTransitionLeavesNothing: a transition that publishes and then
// fails leaves no message and no change to the instance.
func TestFailingTransitionLeavesNothing(t *testing.T) {
	modes(t, func(t *testing.T, pg bool, opts ...saga.Option) {
		w := newWorld(t, backend(pg), opts...)
		b := w.start(t)
		id := "c-" + uuid.NewString()
		w.publish(t, b, Bumped{ID: id, Key: "first"}, uuid.NewString())
		settled(t, 2, b)
		w.publish(t, b, Failing{ID: id}, uuid.NewString())
		if reason := <-w.faults; !strings.Contains(reason, "payment provider refused") {
			t.Errorf("fault reason %q", reason)
		}
		// A later bump's note arrives after anything the failed one
		// could have sent (one relay, FIFO).
		w.publish(t, b, Bumped{ID: id, Key: "second"}, uuid.NewString())
		settled(t, 6, b) // 2 bumps, 2 notes, the failure and its dead letter
		c := w.get(t, id)
		if c.N != 2 || c.Version != 2 {
			t.Errorf("instance: N=%d version=%d, want 2 and 2 (the failed transition changed it)", c.N, c.Version)
		}
		if keys := w.noteKeys(t); strings.Join(keys, ",") != "first,second" {
			t.Errorf("notes %v, want [first second]: the failed transition's publish left", keys)
		}
	})
}

// TestUnhandledEventPolicy: by default an event the state does not handle
// is dead-lettered with a reason naming event and state; with
// IgnoreUnhandled it is acknowledged and changes nothing.
func TestUnhandledEventPolicy(t *testing.T) {
	t.Run("fault", func(t *testing.T) {
		w := newWorld(t, "sqlite")
		b := w.start(t)
		w.publish(t, b, Failing{ID: "nobody"}, uuid.NewString())
		reason := <-w.faults
		if !strings.Contains(reason, "Failing for instance \"nobody\": no instance exists and Initially does not handle it") {
			t.Errorf("reason %q", reason)
		}
		w.publish(t, b, Started{ID: "s1"}, uuid.NewString())
		w.publish(t, b, Started{ID: "s1"}, uuid.NewString()) // a second start, in Active
		reason = <-w.faults
		if !strings.Contains(reason, `event not handled: Started in state "Active" (instance "s1")`) {
			t.Errorf("reason %q", reason)
		}
	})
	t.Run("ignore", func(t *testing.T) {
		w := newWorld(t, "sqlite", saga.OnUnhandled(saga.IgnoreUnhandled))
		b := w.start(t)
		w.publish(t, b, Failing{ID: "nobody"}, uuid.NewString())
		w.publish(t, b, Started{ID: "s1"}, uuid.NewString())
		w.publish(t, b, Started{ID: "s1"}, uuid.NewString())
		settled(t, 3, b)
		if s := b.Stats(); s.DeadLettered != 0 || s.Consumed != 3 {
			t.Errorf("stats %+v, want 3 consumed, none dead-lettered", s)
		}
		if _, err := w.m.Get(context.Background(), w.db, "nobody"); !errors.Is(err, saga.ErrNotFound) {
			t.Errorf("an ignored event created an instance: %v", err)
		}
		if c := w.get(t, "s1"); c.Version != 1 {
			t.Errorf("version %d after an ignored event, want 1", c.Version)
		}
	})
}

// TestFinalize: finalized instances are deleted by default, kept with
// KeepFinalized (then deleted by DeleteFinalized), and listed by state.
func TestFinalize(t *testing.T) {
	ctx := context.Background()
	t.Run("deleted", func(t *testing.T) {
		w := newWorld(t, "sqlite")
		b := w.start(t)
		w.publish(t, b, Started{ID: "f1"}, uuid.NewString())
		settled(t, 1, b)
		w.publish(t, b, Stopped{ID: "f1"}, uuid.NewString())
		settled(t, 4, b) // start, stop, and the two notes it sent and published
		if keys := w.noteKeys(t); strings.Join(keys, ",") != "finally,sent" {
			t.Errorf("notes %v, want the Send step's and Finally's", keys)
		}
		if _, err := w.m.Get(ctx, w.db, "f1"); !errors.Is(err, saga.ErrNotFound) {
			t.Errorf("finalized instance still there: %v", err)
		}
	})
	t.Run("kept", func(t *testing.T) {
		// West of UTC, a local-time updated_at would sort before the UTC
		// cutoff in SQLite's text timestamps and be deleted too early.
		local := time.Local
		time.Local = time.FixedZone("UTC-5", -5*3600)
		t.Cleanup(func() { time.Local = local })
		w := newWorld(t, "sqlite", saga.KeepFinalized())
		b := w.start(t)
		for _, id := range []string{"k1", "k2", "k3"} {
			w.publish(t, b, Started{ID: id}, uuid.NewString())
		}
		settled(t, 3, b)
		w.publish(t, b, Stopped{ID: "k1"}, uuid.NewString())
		w.publish(t, b, Stopped{ID: "k2"}, uuid.NewString())
		settled(t, 9, b) // 5 events, 4 notes
		final, err := w.m.List(ctx, w.db, saga.Final, 10)
		if err != nil || len(final) != 2 {
			t.Fatalf("List(Final) = %d instances, %v; want 2", len(final), err)
		}
		active, err := w.m.List(ctx, w.db, "Active", 10)
		if err != nil || len(active) != 1 || active[0].CorrelationID != "k3" {
			t.Fatalf("List(Active) = %v, %v; want k3", active, err)
		}
		if _, err := w.m.List(ctx, w.db, "", 0); err == nil || !strings.Contains(err.Error(), "limit 0") {
			t.Errorf("List limit 0: %v", err)
		}
		if n, err := w.m.DeleteFinalized(ctx, w.db, time.Hour, 1); err != nil || n != 0 {
			t.Errorf("DeleteFinalized within retention: %d, %v", n, err)
		}
		if n, err := w.m.DeleteFinalized(ctx, w.db, 0, 1); err != nil || n != 2 {
			t.Errorf("DeleteFinalized in batches of 1: %d, %v; want 2", n, err)
		}
		if c := w.get(t, "k3"); c.CurrentState != "Active" {
			t.Errorf("k3 in %s", c.CurrentState)
		}
	})
}

// TestConcurrentBurstOneInstance: a burst of events for one instance,
// delivered concurrently by 3 buses on one PostgreSQL database (and each
// also delivered a second time, to another bus), ends where a serial run
// ends: every event applied once, one note published per event. The 3
// buses each have their own in-process transport, or compete for one
// RabbitMQ queue.
func TestConcurrentBurstOneInstance(t *testing.T) {
	for _, tc := range []struct{ backend, mode string }{
		{"postgres", "optimistic"}, {"postgres", "pessimistic"}, {"rabbitmq", "optimistic"},
		// No re-apply in the transaction: every conflict fails the
		// attempt with ErrConcurrencyConflict, which must be retried by
		// the endpoint, never dead-lettered.
		{"postgres", "no-reapply"},
	} {
		mode := tc.mode
		t.Run(tc.backend+"/"+mode, func(t *testing.T) {
			var opts []saga.Option
			switch mode {
			case "pessimistic":
				opts = append(opts, saga.Pessimistic())
			case "no-reapply":
				opts = append(opts, saga.MaxConflictRetries(0))
			}
			w := newWorld(t, tc.backend, opts...)
			if mode == "no-reapply" {
				w.retries = 1000
			}
			buses := []*bus.Bus{w.start(t), w.start(t), w.start(t)}
			const events = 60
			id := "burst-" + uuid.NewString()
			var wg sync.WaitGroup
			for i := range events {
				wg.Add(1)
				go func() {
					defer wg.Done()
					msgID := fmt.Sprintf("bump-%d", i)
					w.publish(t, buses[i%3], Bumped{ID: id, Key: msgID}, msgID)
					w.publish(t, buses[(i+1)%3], Bumped{ID: id, Key: msgID}, msgID) // a duplicate, elsewhere
				}()
			}
			wg.Wait()
			settled(t, 3*events, buses...) // 2 deliveries and 1 note per event
			var retried int64
			for i, b := range buses {
				s := b.Stats()
				if s.Consumed == 0 {
					t.Errorf("bus %d consumed nothing: the buses did not compete", i)
				}
				if s.DeadLettered != 0 {
					t.Errorf("bus %d dead-lettered %d events", i, s.DeadLettered)
				}
				retried += s.Retries
			}
			if mode == "no-reapply" && retried == 0 {
				t.Errorf("no endpoint retries: the conflicts this mode exists for did not happen")
			}
			for _, b := range buses {
				if err := b.Stop(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			c := w.get(t, id)
			if c.N != events || c.Version != events || c.CurrentState != "Active" {
				t.Errorf("instance after the burst: N=%d version=%d state=%s; a serial run gives %d, %d, Active", c.N, c.Version, c.CurrentState, events, events)
			}
			if keys := w.noteKeys(t); len(keys) != events {
				t.Errorf("%d notes, want %d (a re-applied transition published twice)", len(keys), events)
			}
			// Under the row lock only the first deliveries can race to
			// create the instance (3 buses x 8 concurrent handlers).
			if re := w.attempts.Load() - events; mode == "pessimistic" && re > 24 {
				t.Errorf("%d re-applies under the row lock, want at most 24 (creation races)", re)
			}
			t.Logf("%s: %d events, %d applies (%d re-applied after a conflict)", mode, events, w.attempts.Load(), w.attempts.Load()-events)
		})
	}
}

// TestDefinitionErrors: mistakes in a definition come back from New, all
// at once, each naming what is wrong.
func TestDefinitionErrors(t *testing.T) {
	type plain struct{ ID string }
	_, err := saga.New("bad", func(m *saga.Machine[plain]) {})
	if !errors.Is(err, saga.ErrInvalidMachine) || !strings.Contains(err.Error(), "must be a struct that embeds saga.State") {
		t.Errorf("model without State: %v", err)
	}
	_, err = saga.New("bad", func(m *saga.Machine[Counter]) {
		a := m.State("A")
		m.State("A")
		m.State("")
		ev := saga.NewEvent(m, func(e Started) string { return e.ID })
		saga.NewEvent(m, func(e Started) string { return e.ID })
		saga.NewEvent[Counter, Bumped](m, nil)
		m.During("Nowhere", saga.When(ev))
		m.Initially(saga.When(ev).TransitionTo("Undeclared"), saga.When(ev).TransitionTo(a).Then(nil))
	}, saga.MaxConflictRetries(-1), saga.OnUnhandled(7), saga.RetainFinalized(time.Millisecond))
	for _, want := range []string{
		`state "A" is declared twice`,
		`state "": a state name must have 1-100 characters`,
		`event Started is declared twice`,
		`NewEvent[Bumped]: correlate function is nil`,
		`During("Nowhere"): undeclared state`,
		`TransitionTo("Undeclared"): undeclared state`,
		`When(Started).Then: function is nil`,
		`MaxConflictRetries(-1): must be within 0-100`,
		`OnUnhandled(7)`,
		`RetainFinalized(1ms): the period must be within 1s-`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

// TestRegisterNilMachine: registering a nil machine is a configuration
// error from bus.New, not a crash.
func TestRegisterNilMachine(t *testing.T) {
	_, err := bus.New(quiet(), bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("sagas", func(e *endpoint.Endpoint) { saga.Register[Counter](e, nil) })
	})))
	if !errors.Is(err, bus.ErrInvalidOption) || !strings.Contains(err.Error(), "machineIsNil") {
		t.Errorf("bus.New: %v", err)
	}
}

// TestBadCorrelationID: an event whose correlation id is empty or too long
// is dead-lettered with the limit in the reason.
func TestBadCorrelationID(t *testing.T) {
	w := newWorld(t, "sqlite")
	b := w.start(t)
	w.publish(t, b, Started{ID: ""}, uuid.NewString())
	if r := <-w.faults; !strings.Contains(r, "empty correlation id") {
		t.Errorf("reason %q", r)
	}
	w.publish(t, b, Started{ID: strings.Repeat("x", 201)}, uuid.NewString())
	if r := <-w.faults; !strings.Contains(r, "correlation id has 201 bytes; the limit is 200") {
		t.Errorf("reason %q", r)
	}
}

// TestBehaviorChoice: the first behavior whose conditions hold runs; a
// failing Where falls through to the next; the state's own behaviors come
// before DuringAny's; Ignore overrides the Fault policy.
func TestBehaviorChoice(t *testing.T) {
	type Tally struct {
		saga.State
		Log string
	}
	type Hit struct{ ID, Kind string }
	m, err := saga.New("tally", func(m *saga.Machine[Tally]) {
		on := m.State("On")
		hit := saga.NewEvent(m, func(e Hit) string { return e.ID })
		add := func(s string) func(context.Context, *saga.Context[Tally, Hit]) error {
			return func(ctx context.Context, c *saga.Context[Tally, Hit]) error {
				c.Instance.Log += s
				return nil
			}
		}
		kind := func(k string) func(c *saga.Context[Tally, Hit]) bool {
			return func(c *saga.Context[Tally, Hit]) bool { return c.Message.Kind == k }
		}
		m.Initially(saga.When(hit).Then(add("start,")).TransitionTo(on))
		m.During(on,
			saga.When(hit).Where(kind("a")).Then(add("a,")),
			saga.Ignore(hit).Where(kind("skip")),
			saga.When(hit).Where(kind("b")).Where(func(c *saga.Context[Tally, Hit]) bool { return c.From == on }).Then(add("b,")),
		)
		m.DuringAny(saga.When(hit).Where(kind("a")).Then(add("any-a,")), saga.When(hit).Where(kind("c")).Then(add("any-c,")))
	}, saga.WithTable("saga_tally_"+strings.ReplaceAll(uuid.NewString()[:8], "-", "")))
	if err != nil {
		t.Fatal(err)
	}
	faults := make(chan string, 4)
	b, err := bus.New(quiet(), bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("tally", func(e *endpoint.Endpoint) {
			saga.Register(e, m)
			e.ConcurrentMessageLimit, e.PrefetchCount = 1, 1 // in order
		})
		c.ReceiveEndpoint("tally_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				faults <- d.Headers["BW-Fault-Reason"]
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
	defer b.Stop(ctx)
	if err := saga.Migrate(ctx, b.DB(), m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"", "a", "skip", "b", "c", "zzz"} {
		if err := b.Publish(ctx, Hit{ID: "t", Kind: k}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if r := <-faults; !strings.Contains(r, `Hit in state "On"`) {
		t.Errorf("the unmatched kind: %q", r)
	}
	settled(t, 7, b)
	got, err := m.Get(ctx, b.DB(), "t")
	if err != nil {
		t.Fatal(err)
	}
	if got.Log != "start,a,b,any-c," || got.Version != 4 {
		t.Errorf("log %q version %d, want \"start,a,b,any-c,\" and 4", got.Log, got.Version)
	}
}
