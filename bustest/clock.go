package bustest

import (
	"sync"
	"time"

	"github.com/barewire-go/barewire/bus"
)

// Clock is the harness's fake clock: it runs with the real clock and jumps
// ahead on Advance, never back. On an SQLite database (the embedded
// default) the bus decides by it everywhere it decides by time: inbox lock
// expiry, retention cleanup, the relay's lease and retry delays — in SQL,
// with the clock's time bound into the statements (bus.WithClock) — and
// the in-process waits around them wake when it advances. Redelivery delays
// (Endpoint.Redelivery) and the transports' timers keep the real clock.
type Clock struct {
	mu       sync.Mutex
	offset   time.Duration
	advanced chan struct{}
}

var _ bus.Clock = (*Clock)(nil)

func newClock() *Clock { return &Clock{advanced: make(chan struct{})} }

// Now is the real time plus every Advance so far.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Advance moves the clock d forward and wakes the bus's waits on it. A
// negative d panics: the clock never runs behind the real one (rows the
// database stamps with its own clock must not lie in its future).
func (c *Clock) Advance(d time.Duration) {
	if d < 0 {
		panic("bustest: Clock.Advance: d is " + d.String() + "; must be 0 or more")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
	close(c.advanced)
	c.advanced = make(chan struct{})
}

// Advanced returns a channel closed by the next Advance.
func (c *Clock) Advanced() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.advanced
}

// Clock returns the harness's fake clock. It fails the test when the bus
// has none: on PostgreSQL the database's clock decides.
func (h *Harness) Clock() *Clock {
	h.t.Helper()
	if h.clock == nil {
		h.t.Fatalf("bustest: Clock: this bus runs on PostgreSQL, whose statements decide by the database's clock; the fake clock needs an SQLite database (the embedded default)")
		return nil
	}
	return h.clock
}

// Advance moves the harness's fake clock d forward (see Clock.Advance).
func (h *Harness) Advance(d time.Duration) {
	h.t.Helper()
	if d < 0 {
		h.t.Fatalf("bustest: Advance: d is %v; must be 0 or more (the clock never goes back)", d)
		return
	}
	if c := h.Clock(); c != nil {
		c.Advance(d)
	}
}
