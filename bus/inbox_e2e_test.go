package bus_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// effect is a business row with no unique constraint: a doubled effect
// shows up as two rows instead of being hidden by a constraint error.
type effect struct {
	ID        int64 `gorm:"primaryKey"`
	MessageID string
	Consumer  string
}

// effectTable creates this test's effect table and returns its name.
func (e *realEnv) effectTable(t *testing.T) string {
	t.Helper()
	name := "effects_" + e.suffix
	e.tables = append(e.tables, name)
	if err := e.db.Table(name).AutoMigrate(&effect{}); err != nil {
		t.Fatal(err)
	}
	return name
}

func recordEffect(table, consumer string) func(context.Context, *endpoint.Delivery) error {
	return func(ctx context.Context, d *endpoint.Delivery) error {
		return bus.TxFromContext(ctx).Table(table).Create(&effect{MessageID: d.MessageID, Consumer: consumer}).Error
	}
}

// effects counts rows per (message id, consumer).
func (e *realEnv) effects(t *testing.T, table string) map[[2]string]int {
	t.Helper()
	var rows []effect
	if err := e.db.Table(table).Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := map[[2]string]int{}
	for _, r := range rows {
		out[[2]string{r.MessageID, r.Consumer}]++
	}
	return out
}

func TestInboxSameIDThreeTimesCloseAndApart(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	table := env.effectTable(t)
	typ := env.typ("Payment")
	a, b2 := env.q("ledger"), env.q("notify")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		for _, name := range []string{a, b2} {
			c.ReceiveEndpoint(name, func(e *endpoint.Endpoint) {
				endpoint.RawConsumer(e, recordEffect(table, name), endpoint.ForTypes(typ))
			})
		}
	})...)
	ctx := context.Background()
	pub := func(id string) {
		t.Helper()
		if err := b.Publish(ctx, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		pub("close-" + env.suffix)
	}
	pub("apart-" + env.suffix)
	// Wait for the first copy to be processed, then re-publish seconds apart.
	waitFor(t, func() bool { return len(env.effects(t, table)) == 4 })
	time.Sleep(1500 * time.Millisecond) // deliberately "seconds apart": time is the point here
	pub("apart-" + env.suffix)
	time.Sleep(1500 * time.Millisecond)
	pub("apart-" + env.suffix)
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed+s.Duplicates == 12 })
	got := env.effects(t, table)
	for _, id := range []string{"close-" + env.suffix, "apart-" + env.suffix} {
		for _, c := range []string{a, b2} {
			if n := got[[2]string{id, c}]; n != 1 {
				t.Errorf("%s on %s: %d effects, want 1", id, c, n)
			}
		}
	}
	if d := b.Stats().Duplicates; d != 8 {
		t.Errorf("duplicates absorbed = %d, want 8", d)
	}
}

// TestInboxFailedAttemptReleasesLock is the regression test for BareWire's
// loss bug: a failed attempt left its lock row, and the retry inside the
// lock window was acked as a duplicate, losing the message.
func TestInboxFailedAttemptReleasesLock(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	table := env.effectTable(t)
	typ := env.typ("Flaky")
	q := env.q("flaky")
	var calls atomic.Int32
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			record := recordEffect(table, q)
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				if err := record(ctx, d); err != nil {
					return err
				}
				if calls.Add(1) == 1 {
					return errors.New("first attempt fails after its write")
				}
				return nil
			}, endpoint.ForTypes(typ))
		})
	}, func(o *outbox.Options) { o.InboxLockTimeout = time.Minute; o.InboxRetention = time.Hour })...)
	start := time.Now()
	if err := b.Publish(context.Background(), bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "flaky-" + env.suffix}); err != nil {
		t.Fatal(err)
	}
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed == 1 })
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("retry waited %v: the failed attempt's lock was not released", el)
	}
	got := env.effects(t, table)
	if n := got[[2]string{"flaky-" + env.suffix, q}]; n != 1 || calls.Load() != 2 {
		t.Fatalf("effects=%d calls=%d; want 1 effect after 2 calls (first rolled back)", n, calls.Load())
	}
	if s := b.Stats(); s.Duplicates != 0 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v: the retry must be processed, not skipped as a duplicate", s)
	}
}

func TestInboxBurstWithDuplicatesAcrossConcurrentHandlers(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	table := env.effectTable(t)
	typ := env.typ("Burst")
	q := env.q("burst")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 4
			endpoint.RawConsumer(e, recordEffect(table, q), endpoint.ForTypes(typ))
		})
	})...)
	const unique = 1000
	ids := make([]string, 0, unique*13/10)
	for i := 0; i < unique; i++ {
		ids = append(ids, fmt.Sprintf("burst-%s-%d", env.suffix, i))
	}
	for i := 0; i < unique*3/10; i++ { // 30% duplicates
		ids = append(ids, ids[rand.IntN(unique)])
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	ctx := context.Background()
	for _, id := range ids {
		if err := b.Publish(ctx, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			t.Fatal(err)
		}
	}
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed+s.Duplicates >= int64(len(ids)) })
	got := env.effects(t, table)
	if len(got) != unique {
		t.Fatalf("%d distinct effects; want %d", len(got), unique)
	}
	for k, n := range got {
		if n != 1 {
			t.Fatalf("%v applied %d times", k, n)
		}
	}
	if s := b.Stats(); s.Consumed != unique || s.Duplicates != int64(len(ids)-unique) {
		t.Fatalf("stats %+v; want %d consumed and %d duplicates", s, unique, len(ids)-unique)
	}
}

// TestFailureAfterTakeoverIsNotTheMessages (found by the interaction
// profile, seed 1796690171998554834): a delivery whose attempt outlasted
// InboxLockTimeout, so that another delivery of the same message took the
// entry over and processed it, then failed permanently (its state had moved
// on under it, as a saga's does). It was dead-lettered although the message
// was processed once. Its failure is not the message's: its lock was lost,
// so it looks again, finds the entry processed and counts a duplicate.
func TestFailureAfterTakeoverIsNotTheMessages(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	q, typ := env.q("takeover"), env.typ("Takeover")
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 4
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				if calls.Add(1) == 1 {
					close(entered)
					<-release // outlasts the lock: the second delivery takes over
					return endpoint.Permanent(errors.New("the state moved on under this delivery"))
				}
				return nil
			}, endpoint.ForTypes(typ))
		})
	}, func(o *outbox.Options) { o.InboxLockTimeout = time.Second })...)
	ctx := context.Background()
	send := func() {
		t.Helper()
		if err := b.Send(ctx, q, bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "taken-over"}); err != nil {
			t.Fatal(err)
		}
	}
	send()
	<-entered
	send() // the same id: it waits for the lock to expire, then takes it over
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed == 1 })
	close(release)
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed+s.Duplicates+s.DeadLettered == 2 })
	if s := b.Stats(); s.DeadLettered != 0 || s.Duplicates != 1 {
		t.Fatalf("stats %+v: want the failed delivery that lost its lock counted as a duplicate, nothing dead-lettered", s)
	}
}
