package bus_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/outbox/outboxtest"
	"github.com/barewire-go/barewire/transport/inproc"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// inprocEndpoints is the in-process transport (the embedded default's) with
// the receive endpoints declare declares in its block.
func inprocEndpoints(declare func(c *endpoint.Endpoints)) bus.Option {
	return bus.WithTransport(inproc.New(func(c *inproc.Config) { declare(&c.Endpoints) }))
}

// inprocEndpoint is the in-process transport with one receive endpoint.
func inprocEndpoint(name string, configure func(e *endpoint.Endpoint)) bus.Option {
	return inprocEndpoints(func(c *endpoint.Endpoints) { c.ReceiveEndpoint(name, configure) })
}

// waitFor polls cond: used only where no signal exists (database state).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// busSignals holds, for every bus started by start, a signal fired by each
// of its events (bus.WithObserver).
var busSignals sync.Map // *bus.Bus → *busSignal

type busSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBusSignal() *busSignal { return &busSignal{ch: make(chan struct{})} }

func (s *busSignal) fire(bus.Event) {
	s.mu.Lock()
	close(s.ch)
	s.ch = make(chan struct{})
	s.mu.Unlock()
}

func (s *busSignal) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch
}

// waitStats waits until cond holds for b's Stats, re-checking on each of
// the bus's events instead of polling: the counters a delivery moves
// (consumed, duplicates, dead-lettered, ...) are counted before its
// EventHandled is emitted, so the check after the last event sees them.
func waitStats(t *testing.T, b *bus.Bus, cond func(bus.Stats) bool) {
	t.Helper()
	waitStatsWithin(t, b, 10*time.Second, cond)
}

// waitStatsWithin is waitStats with a bound of its own, for tests that
// move many messages through SQLite under -race on a loaded machine.
func waitStatsWithin(t *testing.T, b *bus.Bus, within time.Duration, cond func(bus.Stats) bool) {
	t.Helper()
	v, ok := busSignals.Load(b)
	if !ok {
		t.Fatal("waitStats: the bus was not started by start")
	}
	sig := v.(*busSignal)
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		next := sig.next()
		st := b.Stats()
		if cond(st) {
			return
		}
		select {
		case <-next:
		case <-timeout.C:
			t.Fatalf("stats condition not met within %v: %+v", within, st)
		}
	}
}

// drain waits until the bus has been idle for several consecutive checks.
func drain(t *testing.T, b *bus.Bus) {
	t.Helper()
	stable := 0
	waitFor(t, func() bool {
		if bus.IdleForTest(b) {
			stable++
		} else {
			stable = 0
		}
		return stable >= 10
	})
}

func processedEntries(t *testing.T, b *bus.Bus, id string) int {
	t.Helper()
	yes := true
	es, err := b.InboxStore().List(context.Background(), inbox.Query{MessageID: id, Processed: &yes})
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// deliveredRows counts s's delivered rows (Stats does not).
func deliveredRows(t testing.TB, s outbox.Store) int64 {
	t.Helper()
	return outboxtest.Delivered(t, context.Background(), s)
}
