package inbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// memStore is the smallest Store the two-phase middleware needs: entries
// in a map, a lock that never expires by itself. busy receives the key of
// every TryLock that found the entry locked.
type memStore struct {
	mu      sync.Mutex
	locked  map[Key]string
	done    map[Key]bool
	n       int
	busy    chan Key
	noStats // the rest of Store, unused here
}

func newMemStore() *memStore {
	return &memStore{locked: map[Key]string{}, done: map[Key]bool{}, busy: make(chan Key, 16)}
}

func (s *memStore) TryLock(_ context.Context, k Key, _ time.Duration) (Lock, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.done[k]:
		return Lock{State: Processed}, nil
	case s.locked[k] != "":
		s.busy <- k
		return Lock{State: Busy, ExpiresAt: time.Now().Add(time.Hour)}, nil
	}
	s.n++
	tok := string(rune('a' + s.n))
	s.locked[k] = tok
	return Lock{State: Acquired, Token: tok}, nil
}

func (s *memStore) Process(ctx context.Context, k Key, tok string, fn func(context.Context) error) error {
	if err := fn(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locked[k] != tok {
		return ErrLockLost
	}
	delete(s.locked, k)
	s.done[k] = true
	return nil
}

func (s *memStore) Release(_ context.Context, k Key, tok string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locked[k] == tok {
		delete(s.locked, k)
	}
	return nil
}

type noStats struct{}

func (noStats) ProcessAndLock(context.Context, Key, func(context.Context) error) (bool, error) {
	return false, errors.New("not used")
}
func (noStats) Cleanup(context.Context, time.Duration, int) (int, error) { return 0, nil }
func (noStats) List(context.Context, Query) ([]Entry, error)             { return nil, nil }
func (noStats) Stats(context.Context) (Stats, error)                     { return Stats{}, nil }

// TestWaiterWakesWhenTheHolderInThisProcessEnds: a duplicate that finds the
// entry locked by a delivery of the same middleware goes on as soon as that
// delivery ends (here: a duplicate skipped, after a success; a fresh
// attempt, after a failure), not at its next BusyDelay (an hour here).
func TestWaiterWakesWhenTheHolderInThisProcessEnds(t *testing.T) {
	for _, holderFails := range []bool{false, true} {
		name := map[bool]string{false: "HolderProcessed", true: "HolderFailed"}[holderFails]
		t.Run(name, func(t *testing.T) {
			s := newMemStore()
			m := &Middleware{Store: s, ConsumerType: "c", LockTimeout: time.Hour, BusyDelay: time.Hour, Settled: &Settled{}}
			inHandler, release := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			runs := 0
			h := m.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				mu.Lock()
				runs++
				first := runs == 1
				mu.Unlock()
				if first {
					close(inHandler)
					<-release
					if holderFails {
						return nil, errors.New("handler failed")
					}
				}
				return nil, nil
			})
			holder := make(chan error, 1)
			go func() { _, err := h(message.NewMessage("m1", nil)); holder <- err }()
			<-inHandler
			dup := make(chan error, 1)
			go func() { _, err := h(message.NewMessage("m1", nil)); dup <- err }()
			<-s.busy // the duplicate found the entry locked and waits
			close(release)
			if err := <-holder; (err != nil) != holderFails {
				t.Fatalf("holder: %v", err)
			}
			select {
			case err := <-dup:
				if err != nil {
					t.Fatalf("waiter: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter was still waiting 5s after the holder ended (BusyDelay is an hour)")
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[bool]int{false: 1, true: 2}[holderFails]; runs != want {
				t.Fatalf("handler ran %d times; want %d", runs, want)
			}
		})
	}
}

// TestSettledForgetsWhatNobodyWatches: watches that end leave nothing
// behind, and a Settle with nobody watching is a no-op.
func TestSettledForgetsWhatNobodyWatches(t *testing.T) {
	var s Settled
	k := Key{MessageID: "m", ConsumerType: "c"}
	s.Settle(k)
	ch1, stop1 := s.Watch(k)
	ch2, stop2 := s.Watch(k)
	s.Settle(k)
	for _, ch := range []<-chan struct{}{ch1, ch2} {
		select {
		case <-ch:
		default:
			t.Fatal("a watcher was not woken by Settle")
		}
	}
	stop1()
	ch3, stop3 := s.Watch(k)
	select {
	case <-ch3:
		t.Fatal("a watch after the Settle saw it")
	default:
	}
	stop2()
	stop3()
	if len(s.waits) != 0 || s.waiting.Load() != 0 {
		t.Fatalf("after every watch ended: %d keys, %d waiting; want 0, 0", len(s.waits), s.waiting.Load())
	}
}
