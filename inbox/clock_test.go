package inbox

import (
	"context"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu       sync.Mutex
	offset   time.Duration
	advanced chan struct{}
	waiting  chan struct{} // a send for every Advanced call: about to wait
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *fakeClock) Advanced() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case c.waiting <- struct{}{}:
	default:
	}
	return c.advanced
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
	close(c.advanced)
	c.advanced = make(chan struct{})
}

// TestWaitForBusyLockWakesWhenTheClockAdvances: a delivery waiting for
// another's lock re-checks as soon as the fake clock moves, not after
// BusyDelay of real time.
func TestWaitForBusyLockWakesWhenTheClockAdvances(t *testing.T) {
	clk := &fakeClock{advanced: make(chan struct{}), waiting: make(chan struct{}, 1)}
	m := &Middleware{Clock: clk}
	done := make(chan error, 1)
	expires := clk.Now().Add(time.Hour)
	go func() { done <- m.wait(context.Background(), expires, time.Hour, nil) }()
	<-clk.waiting
	clk.advance(time.Hour)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not end when the clock advanced")
	}
}
