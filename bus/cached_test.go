package bus

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestCachedWaitersKeepTheirOwnDeadline (issue 33, waits: U13): the
// health and metrics counts are fetched by one caller at a time; a
// fetch that hangs (a silent database) used to hold every later caller
// behind the mutex, whatever their deadlines. Each caller now waits only
// until its own context ends, one fetch serves them all, and the next
// call after it gets its value.
func TestCachedWaitersKeepTheirOwnDeadline(t *testing.T) {
	var c cached[int]
	release := make(chan struct{})
	var fetches atomic.Int32
	fetch := func(ctx context.Context) (int, error) {
		fetches.Add(1)
		select {
		case <-release:
			return 42, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	results := make(chan error, 3)
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			began := time.Now()
			_, err := c.get(ctx, time.Minute, fetch)
			if time.Since(began) > time.Second {
				err = errors.New("waited past its own deadline")
			}
			results <- err
		}()
	}
	for range 3 {
		if err := <-results; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a caller behind a hung fetch: %v, want its own deadline", err)
		}
	}
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 3 callers at once, want 1", n)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := c.get(context.Background(), time.Minute, fetch)
		if err == nil && v == 42 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("get after the fetch was released = %d, %v", v, err)
		}
		time.Sleep(10 * time.Millisecond) // the shared fetch records its value by itself
	}
}
