package bus

import (
	"errors"
	"time"
)

// Clock is a controllable time source for tests (bustest's fake clock is
// one). Production buses have none: the database's clock decides.
type Clock interface {
	// Now is the current time. It must never run behind the real clock:
	// rows the database stamps with its own clock (a new outbox row's
	// created_at and available_at) must not lie in the clock's future.
	Now() time.Time
	// Advanced returns a channel closed the next time the clock jumps
	// forward; the bus's in-process waits listen to it.
	Advanced() <-chan struct{}
}

// ErrClockUnsupported is returned by New when WithClock is combined with a
// PostgreSQL database: its statements decide by the database's clock.
var ErrClockUnsupported = errors.New("bus: WithClock needs an SQLite database (the embedded default, WithSQLite, or WithOutbox on SQLite)")

// WithClock makes the bus's time-based behaviour read c instead of the real
// clock: inbox lock expiry, retention cleanup, the relay's lease and retry
// delays (decided in SQL, with c's time bound into every statement through
// gormstore.WithClock), and the in-process waits around them (a delivery
// waiting for another's inbox lock, the cleanup interval, the relay's
// sleep), which also wake when c advances. For tests; on PostgreSQL New
// fails with ErrClockUnsupported. Redelivery delays and the transports'
// own timers keep the real clock.
func WithClock(c Clock) Option {
	return func(cfg *config) error {
		if c == nil {
			return optErr("WithClock: nil clock")
		}
		cfg.clock = c
		return nil
	}
}
