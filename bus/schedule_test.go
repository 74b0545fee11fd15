package bus_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// schedSetup is one transport (and its database) for the scheduling tests.
type schedSetup struct {
	queue, typ string
	options    func(declare func(*endpoint.Endpoints)) []bus.Option
	// child is the environment of a re-executed test binary that
	// schedules on the same database (schedChild).
	child []string
}

// schedCases are the three transports: in-process on SQLite, RabbitMQ with
// PostgreSQL, and the PostgreSQL transport.
var schedCases = []struct {
	name string
	make func(t *testing.T) schedSetup
}{
	{"inproc+sqlite", func(t *testing.T) schedSetup {
		path := filepath.Join(t.TempDir(), "bw.db")
		q := "reminders"
		return schedSetup{
			queue: q, typ: "Reminder",
			options: func(declare func(*endpoint.Endpoints)) []bus.Option {
				return []bus.Option{quiet(), bus.WithSQLite(path), inprocEndpoints(declare)}
			},
			child: []string{"BW_SCHED_CHILD=sqlite", "BW_SCHED_PATH=" + path},
		}
	}},
	{"rabbitmq+postgres", func(t *testing.T) schedSetup {
		env := newRealEnv(t)
		return schedSetup{
			queue: env.q("reminders"), typ: env.typ("Reminder"),
			options: func(declare func(*endpoint.Endpoints)) []bus.Option {
				return env.options(declare)
			},
			child: []string{"BW_SCHED_CHILD=rabbitmq", "BW_SCHED_PREFIX=" + env.prefix, "BW_SCHED_DSN=" + testenv.PostgresDSN(t), "BW_SCHED_AMQP=" + env.url},
		}
	}},
	{"pgtransport", func(t *testing.T) schedSetup {
		env := newPgEnv(t)
		return schedSetup{
			queue: "reminders-" + env.suffix, typ: "Reminder-" + env.suffix,
			options: func(declare func(*endpoint.Endpoints)) []bus.Option {
				return env.options(env.db, declare)
			},
			child: []string{"BW_SCHED_CHILD=pgtransport", "BW_SCHED_PREFIX=" + env.prefix, "BW_SCHED_DSN=" + env.dsn},
		}
	}},
}

type arrival struct {
	id      string
	at      time.Time
	headers map[string]string
}

// schedConsumer records every arrival on ch.
func schedConsumer(s schedSetup, ch chan<- arrival) func(*endpoint.Endpoints) {
	return func(eps *endpoint.Endpoints) {
		eps.ReceiveEndpoint(s.queue, func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				ch <- arrival{id: d.MessageID, at: time.Now(), headers: d.Headers}
				return nil
			}, endpoint.ForTypes(s.typ))
		})
	}
}

func next(t *testing.T, ch <-chan arrival, within time.Duration) arrival {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(within):
		t.Fatalf("nothing arrived within %v", within)
		return arrival{}
	}
}

// TestScheduledDeliveredAfterDelayNotBefore: on every transport a message
// published with bus.Delay (outside a transaction, without
// PublishThroughOutbox) and one sent with bus.DeliverAt in a transaction
// (which the PostgreSQL transport would otherwise write straight to its
// queue) arrive after their time and not before, without the schedule
// headers; a message published after them, unscheduled, is not held up.
func TestScheduledDeliveredAfterDelayNotBefore(t *testing.T) {
	for _, c := range schedCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := c.make(t)
			got := make(chan arrival, 10)
			b := start(t, s.options(schedConsumer(s, got))...)
			ctx := context.Background()
			const delay = 1200 * time.Millisecond
			began := time.Now()
			if err := b.Publish(ctx, bus.Raw{Type: s.typ, Body: []byte(`{}`)}, bus.Delay(delay, bus.Headers{bus.HeaderMessageID: "by-delay", "x-tag": "kept"})); err != nil {
				t.Fatal(err)
			}
			at := time.Now().Add(delay)
			if err := b.Transaction(ctx, func(tx *gorm.DB) error {
				return b.SendTx(ctx, tx, s.queue, bus.Raw{Type: s.typ, Body: []byte(`{}`)}, bus.DeliverAt(at, bus.Headers{bus.HeaderMessageID: "by-time"}))
			}); err != nil {
				t.Fatal(err)
			}
			// Both wait, listed as scheduled: asked at once, not after the
			// neighbour's delivery, which a loaded machine (the race
			// detector, other packages' tests) once let run past the delay.
			listed := time.Now()
			sched, err := b.OutboxStore().List(ctx, outbox.Query{Scheduled: true})
			if listed.Sub(began) < delay-200*time.Millisecond {
				if err != nil || len(sched) != 2 {
					t.Fatalf("List(Scheduled) = %d rows, %v; want the 2 waiting messages", len(sched), err)
				}
			} else {
				t.Logf("List(Scheduled) not judged: asked %v after the first publish, too close to the delay", listed.Sub(began))
			}
			if err := b.Publish(ctx, bus.Raw{Type: s.typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "neighbour"}); err != nil {
				t.Fatal(err)
			}
			// The neighbour first, at once.
			if a := next(t, got, 5*time.Second); a.id != "neighbour" || a.at.Sub(began) >= delay {
				t.Fatalf("first arrival %s after %v; want the unscheduled neighbour, before %v", a.id, a.at.Sub(began), delay)
			}
			for range 2 {
				a := next(t, got, 10*time.Second)
				due := began.Add(delay)
				if a.id == "by-time" {
					due = at
				}
				// The database's clock decides; 5ms covers SQLite's
				// millisecond timestamps.
				if early := due.Sub(a.at); early > 5*time.Millisecond {
					t.Errorf("%s arrived %v before it was due", a.id, early)
				}
				if late := a.at.Sub(due); late > 2*time.Second {
					t.Errorf("%s arrived %v after it was due", a.id, late)
				}
				t.Logf("%s: due → consumed %v", a.id, a.at.Sub(due).Round(time.Millisecond))
				for _, h := range []string{bus.HeaderDelay, bus.HeaderDeliverAt} {
					if v, ok := a.headers[h]; ok {
						t.Errorf("%s reached the consumer with %s=%q", a.id, h, v)
					}
				}
				if a.id == "by-delay" && a.headers["x-tag"] != "kept" {
					t.Errorf("by-delay lost its other header: %v", a.headers)
				}
			}
		})
	}
}

// TestScheduledCancelBeforeDue: a cancelled message never arrives (one
// scheduled just after it, for the same time, does), and cancelling again
// reports false.
func TestScheduledCancelBeforeDue(t *testing.T) {
	for _, c := range schedCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := c.make(t)
			got := make(chan arrival, 10)
			b := start(t, s.options(schedConsumer(s, got))...)
			ctx := context.Background()
			const delay = 800 * time.Millisecond
			id := bus.NewMessageID()
			if err := b.Send(ctx, s.queue, bus.Raw{Type: s.typ, Body: []byte(`{}`)}, bus.Delay(delay, bus.Headers{bus.HeaderMessageID: id})); err != nil {
				t.Fatal(err)
			}
			if err := b.Send(ctx, s.queue, bus.Raw{Type: s.typ, Body: []byte(`{}`)}, bus.Delay(delay+100*time.Millisecond, bus.Headers{bus.HeaderMessageID: "witness"})); err != nil {
				t.Fatal(err)
			}
			ok, err := b.CancelScheduled(ctx, id)
			if err != nil || !ok {
				t.Fatalf("CancelScheduled = %v, %v; want true", ok, err)
			}
			if a := next(t, got, 10*time.Second); a.id != "witness" {
				t.Fatalf("arrived %s; the cancelled message must never arrive", a.id)
			}
			drain(t, b)
			select {
			case a := <-got:
				t.Fatalf("arrived %s after the witness", a.id)
			default:
			}
			if ok, err := b.CancelScheduled(ctx, id); err != nil || ok {
				t.Fatalf("second CancelScheduled = %v, %v; want false, nil", ok, err)
			}
			if ok, err := b.CancelScheduled(ctx, "witness"); err != nil || ok {
				t.Fatalf("CancelScheduled of a delivered message = %v, %v; want false, nil", ok, err)
			}
		})
	}
}

// TestScheduledSurvivesSIGKILL: a child process (this test binary, re-run)
// schedules messages and is killed with SIGKILL before they are due; a bus
// started afterwards on the same database delivers every one exactly once,
// not before its time.
func TestScheduledSurvivesSIGKILL(t *testing.T) {
	for _, c := range schedCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := c.make(t)
			const n = 20
			// Far enough ahead for a child built with -race to start on a
			// busy machine; the test skips if it still was not.
			due := time.Now().Add(8 * time.Second)
			testenv.KillChildWhenReady(t, slices.Concat(s.child, []string{"BW_SCHED_QUEUE=" + s.queue, "BW_SCHED_TYPE=" + s.typ,
				"BW_SCHED_N=" + strconv.Itoa(n), "BW_SCHED_AT=" + due.Format(time.RFC3339Nano)})...)
			if left := time.Until(due); left < 500*time.Millisecond {
				t.Skipf("the child scheduled only %v before the due time; the machine is too slow for this test", left)
			}

			got := make(chan arrival, 2*n)
			b := start(t, s.options(schedConsumer(s, got))...)
			seen := map[string]int{}
			for range n {
				a := next(t, got, 15*time.Second)
				seen[a.id]++
				if early := due.Sub(a.at); early > 5*time.Millisecond {
					t.Errorf("%s arrived %v before it was due", a.id, early)
				}
			}
			drain(t, b)
			close(got)
			for a := range got {
				seen[a.id]++
			}
			ids := slices.Sorted(func(yield func(string) bool) {
				for id := range seen {
					if !yield(id) {
						return
					}
				}
			})
			if len(seen) != n {
				t.Fatalf("%d distinct messages arrived, want %d: %v", len(seen), n, ids)
			}
			for id, k := range seen {
				if k != 1 {
					t.Errorf("%s arrived %d times", id, k)
				}
			}
		})
	}
}

// schedChild is the child of TestScheduledSurvivesSIGKILL: it schedules
// BW_SCHED_N messages, says "scheduled" and waits to be killed.
func schedChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "schedule child:", err)
		os.Exit(2)
	}
	kind, queue, typ := os.Getenv("BW_SCHED_CHILD"), os.Getenv("BW_SCHED_QUEUE"), os.Getenv("BW_SCHED_TYPE")
	n, _ := strconv.Atoi(os.Getenv("BW_SCHED_N"))
	due, err := time.Parse(time.RFC3339Nano, os.Getenv("BW_SCHED_AT"))
	if err != nil {
		fail(err)
	}
	prefix := os.Getenv("BW_SCHED_PREFIX")
	opts := []bus.Option{quiet()}
	switch kind {
	case "sqlite":
		opts = append(opts, bus.WithSQLite(os.Getenv("BW_SCHED_PATH")), bus.WithTransport(inproc.New(nil)))
	case "rabbitmq", "pgtransport":
		db, err := postgresdb.Open(os.Getenv("BW_SCHED_DSN"))
		if err != nil {
			fail(err)
		}
		opts = append(opts, bus.WithDatabase(db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }))
		if kind == "rabbitmq" {
			opts = append(opts, bus.WithTransport(rabbitmq.New(os.Getenv("BW_SCHED_AMQP"), func(*rabbitmq.Config) {})))
		} else {
			opts = append(opts, bus.WithTransport(pgtransport.New(db, func(c *pgtransport.Config) { c.TablePrefix = prefix })))
		}
	default:
		fail(fmt.Errorf("unknown BW_SCHED_CHILD %q", kind))
	}
	b, err := bus.New(opts...)
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		fail(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			errs <- b.Send(ctx, queue, bus.Raw{Type: typ, Body: []byte(`{}`)},
				bus.DeliverAt(due, bus.Headers{bus.HeaderMessageID: fmt.Sprintf("killed-%d", i)}))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			fail(err)
		}
	}
	testenv.SignalReadyAndWait()
}

// TestScheduleValidation: bad schedules are refused with ErrInvalidMessage
// and nothing is written; a time in the past or a delay ≤ 0 means at once.
func TestScheduleValidation(t *testing.T) {
	t.Parallel()
	got := make(chan arrival, 10)
	s := schedSetup{queue: "v", typ: "V"}
	b := start(t, quiet(), inprocEndpoints(schedConsumer(s, got)))
	ctx := context.Background()
	msg := bus.Raw{Type: "V", Body: []byte(`{}`)}
	for _, h := range []bus.Headers{
		bus.Delay(bus.MaxScheduleDelay + time.Hour),
		bus.DeliverAt(time.Now().Add(bus.MaxScheduleDelay + time.Hour)),
		bus.DeliverAt(time.Time{}),
		{bus.HeaderDelay: "soon"},
		{bus.HeaderDeliverAt: "tomorrow"},
		bus.Delay(time.Second, bus.DeliverAt(time.Now())),
	} {
		err := b.Publish(ctx, msg, h)
		if !errors.Is(err, bus.ErrInvalidMessage) {
			t.Errorf("Publish with %v = %v; want ErrInvalidMessage", h, err)
		}
	}
	if ok, err := b.CancelScheduled(ctx, ""); ok || !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("CancelScheduled(\"\") = %v, %v; want ErrInvalidMessage", ok, err)
	}
	began := time.Now()
	for i, h := range []bus.Headers{bus.Delay(0), bus.Delay(-time.Hour), bus.DeliverAt(time.Now().Add(-time.Hour))} {
		h[bus.HeaderMessageID] = "now-" + strconv.Itoa(i)
		if err := b.Publish(ctx, msg, h); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if a := next(t, got, 5*time.Second); a.at.Sub(began) > 2*time.Second {
			t.Errorf("%s, due at once, arrived after %v", a.id, a.at.Sub(began))
		}
	}
	// The consumer can see a message before the relay marks its row
	// delivered, so wait for the relay; then the outbox must hold exactly
	// the three accepted rows (refused schedules write nothing).
	var st outbox.Stats
	waitFor(t, func() bool {
		var err error
		st, err = b.OutboxStore().Stats(ctx)
		return err == nil && st.Pending == 0
	})
	if total := st.Pending + st.Parked + deliveredRows(t, b.OutboxStore()); total != 3 {
		t.Errorf("outbox stats %+v: %d rows; want the 3 accepted ones (refused schedules write nothing)", st, total)
	}
}

// TestScheduleAndCancelInsideConsumer: a consumer schedules a message and
// cancels another in its own transaction; when the consumer fails, both
// roll back with it (the scheduled one is never written, the cancelled one
// stays), and when it succeeds both take effect.
func TestScheduleAndCancelInsideConsumer(t *testing.T) {
	t.Parallel()
	got := make(chan arrival, 10)
	var mu sync.Mutex
	var cancelled []bool
	attempts := 0
	var b *bus.Bus
	b = start(t, quiet(), inprocEndpoints(func(eps *endpoint.Endpoints) {
		eps.ReceiveEndpoint("timers", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				attempts++
				if err := d.Send(ctx, "fired", bus.Raw{Type: "Fired", Body: []byte(`{}`)},
					bus.Delay(300*time.Millisecond, bus.Headers{bus.HeaderMessageID: "follow-up"})); err != nil {
					return err
				}
				ok, err := b.CancelScheduled(ctx, "old-timeout")
				if err != nil {
					return err
				}
				cancelled = append(cancelled, ok)
				if attempts == 1 {
					return errors.New("first attempt fails after scheduling and cancelling")
				}
				return nil
			}, endpoint.ForTypes("Start"))
		})
		eps.ReceiveEndpoint("fired", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				got <- arrival{id: d.MessageID, at: time.Now()}
				return nil
			}, endpoint.ForTypes("Fired"))
		})
	}))
	ctx := context.Background()
	if err := b.Send(ctx, "fired", bus.Raw{Type: "Fired", Body: []byte(`{}`)}, bus.Delay(time.Hour, bus.Headers{bus.HeaderMessageID: "old-timeout"})); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, "timers", bus.Raw{Type: "Start", Body: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	if a := next(t, got, 10*time.Second); a.id != "follow-up" {
		t.Fatalf("arrived %s, want follow-up", a.id)
	}
	drain(t, b)
	mu.Lock()
	defer mu.Unlock()
	// The first attempt's cancel rolled back, so the second found the row
	// again and cancelled it for good.
	if !slices.Equal(cancelled, []bool{true, true}) {
		t.Errorf("cancels reported %v; want [true true]", cancelled)
	}
	if rows, err := b.OutboxStore().List(ctx, outbox.Query{Scheduled: true}); err != nil || len(rows) != 0 {
		t.Errorf("still scheduled: %d rows, %v; want none", len(rows), err)
	}
	select {
	case a := <-got:
		t.Errorf("arrived %s: the rolled-back attempt's follow-up must not leave", a.id)
	default:
	}
}

// TestHealthIgnoresScheduledRows: rows scheduled for later are not a
// backlog: the relay check passes with more of them than maxPending.
func TestHealthIgnoresScheduledRows(t *testing.T) {
	t.Parallel()
	b := start(t, quiet(), bus.WithHealthThresholds(time.Minute, 2), inprocEndpoint("later", func(e *endpoint.Endpoint) {
		endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { return nil }, endpoint.ForTypes("Later"))
	}))
	ctx := context.Background()
	for range 3 {
		if err := b.Send(ctx, "later", bus.Raw{Type: "Later", Body: []byte(`{}`)}, bus.Delay(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	rep := b.CheckHealth(ctx)
	if got := checkStatus(rep, "relay"); got != "pass" {
		t.Fatalf("relay check = %s with 3 rows scheduled an hour ahead and maxPending 2; want pass (%+v)", got, rep.Checks)
	}
}

// TestScheduledNotBoundByPollingInterval: with a 30s PollingInterval the
// relay still sends a scheduled message at its time: it sleeps until the
// earliest due row, not a whole poll.
func TestScheduledNotBoundByPollingInterval(t *testing.T) {
	t.Parallel()
	got := make(chan arrival, 1)
	s := schedSetup{queue: "poll", typ: "Poll"}
	b := start(t, quiet(), inprocEndpoints(schedConsumer(s, got)),
		bus.WithOutbox(func(o *outbox.Options) { o.PollingInterval = 30 * time.Second }))
	ctx := context.Background()
	const delay = 700 * time.Millisecond
	began := time.Now()
	if err := b.Send(ctx, s.queue, bus.Raw{Type: s.typ, Body: []byte(`{}`)}, bus.Delay(delay)); err != nil {
		t.Fatal(err)
	}
	a := next(t, got, 10*time.Second)
	if late := a.at.Sub(began.Add(delay)); late > 5*time.Second || late < -5*time.Millisecond {
		t.Fatalf("consumed %v after its due time; want well within the 30s PollingInterval, never early", late)
	}
}
