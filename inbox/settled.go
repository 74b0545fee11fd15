package inbox

import (
	"sync"
	"sync/atomic"
)

// Settled wakes a delivery that waits for an inbox entry locked by another
// delivery of the same process: the holder calls Settle when its attempt
// ends (processed, failed or released), and the waiter tries the lock again
// at once instead of at its next BusyDelay. A holder in another process is
// still seen by polling (Middleware.BusyDelay).
//
// The zero value is ready to use. Settle costs one atomic load when nobody
// waits.
type Settled struct {
	waiting atomic.Int64
	mu      sync.Mutex
	waits   map[Key]*settleWait
}

type settleWait struct {
	ch chan struct{}
	n  int
}

// Watch returns a channel closed at the next Settle of k, and a function
// that must be called when the caller stops watching. Watch before reading
// the entry's state, so that a Settle between the read and the wait is not
// missed.
func (s *Settled) Watch(k Key) (<-chan struct{}, func()) {
	s.mu.Lock()
	s.waiting.Add(1)
	if s.waits == nil {
		s.waits = map[Key]*settleWait{}
	}
	w := s.waits[k]
	if w == nil {
		w = &settleWait{ch: make(chan struct{})}
		s.waits[k] = w
	}
	w.n++
	s.mu.Unlock()
	return w.ch, func() {
		s.mu.Lock()
		s.waiting.Add(-1)
		w.n--
		if w.n == 0 && s.waits[k] == w {
			delete(s.waits, k)
		}
		s.mu.Unlock()
	}
}

// Settle wakes every delivery watching k.
func (s *Settled) Settle(k Key) {
	if s == nil || s.waiting.Load() == 0 {
		return
	}
	s.mu.Lock()
	if w := s.waits[k]; w != nil {
		close(w.ch)
		delete(s.waits, k)
	}
	s.mu.Unlock()
}
