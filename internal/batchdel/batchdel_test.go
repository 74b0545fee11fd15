package batchdel

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
	waiting  chan struct{} // a send for every Advanced call: Loop is about to wait
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

// TestLoopRunsWhenTheClockPassesTheInterval: with a fake clock the cleanup
// interval is measured on it, so an advance past it runs a pass at once,
// and an advance short of it does not.
func TestLoopRunsWhenTheClockPassesTheInterval(t *testing.T) {
	clk := &fakeClock{advanced: make(chan struct{}), waiting: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	passes := make(chan struct{}, 10)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		Loop(ctx, time.Hour, 10, func(context.Context, int) (int, error) { passes <- struct{}{}; return 0, nil }, nil, "test", clk)
	}()
	defer func() { cancel(); <-stopped }()

	<-clk.waiting
	clk.advance(time.Minute) // short of the interval: no pass
	<-clk.waiting
	clk.advance(time.Hour)
	select {
	case <-passes:
	case <-time.After(10 * time.Second):
		t.Fatal("no cleanup pass after the clock passed the interval")
	}
	<-clk.waiting // back waiting after the pass: there was exactly one
	if n := len(passes); n != 0 {
		t.Fatalf("%d more passes without the clock passing the interval again", n)
	}
}
