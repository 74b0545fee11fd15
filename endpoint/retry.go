package endpoint

import (
	"fmt"
	"time"
)

// RetryKind selects the shape of in-process retry delays.
type RetryKind int

const (
	// RetryNone: the first failure dead-letters the message. (The zero
	// RetryKind means "not set": the endpoint uses DefaultRetry.)
	RetryNone RetryKind = iota + 1
	// RetryImmediate retries with no delay.
	RetryImmediate
	// RetryInterval waits Interval between attempts.
	RetryInterval
	// RetryIncremental waits Interval, then Interval+Increment, and so on.
	RetryIncremental
	// RetryExponential waits Interval, doubling (times Multiplier) up to
	// MaxInterval, with random jitter (RandomizationFactor).
	RetryExponential
)

// RetryPolicy is an endpoint's in-process retry policy: how many times a
// failed message is handed to its consumer again, and how long to wait in
// between, before it is dead-lettered. Build one with Immediate, Interval,
// Incremental, Exponential or NoRetry.
type RetryPolicy struct {
	Kind RetryKind
	// Retries is how many times to retry after the first attempt.
	Retries int
	// Interval is the (first) delay.
	Interval time.Duration
	// Increment is added to the delay after each retry (RetryIncremental).
	Increment time.Duration
	// MaxInterval caps the delay (RetryExponential). Defaults to 30s.
	MaxInterval time.Duration
	// Multiplier grows the delay (RetryExponential). Defaults to 2.
	Multiplier float64
	// RandomizationFactor adds jitter: each delay is drawn from
	// [d*(1-f), d*(1+f)] (RetryExponential). Exponential sets 0.2; zero
	// means no jitter.
	RandomizationFactor float64
	// ShouldRetry, when set, decides which errors are retried; others are
	// dead-lettered at once. Errors wrapped with Permanent are never retried.
	ShouldRetry func(err error) bool
}

// NoRetry dead-letters a message on its first failure.
func NoRetry() RetryPolicy { return RetryPolicy{Kind: RetryNone} }

// Immediate retries n times with no delay.
func Immediate(n int) RetryPolicy { return RetryPolicy{Kind: RetryImmediate, Retries: n} }

// Interval retries n times, waiting d between attempts.
func Interval(n int, d time.Duration) RetryPolicy {
	return RetryPolicy{Kind: RetryInterval, Retries: n, Interval: d}
}

// Incremental retries n times, waiting initial, then initial+increment, ...
func Incremental(n int, initial, increment time.Duration) RetryPolicy {
	return RetryPolicy{Kind: RetryIncremental, Retries: n, Interval: initial, Increment: increment}
}

// Exponential retries n times with exponentially growing, jittered delays
// from initial up to max.
func Exponential(n int, initial, max time.Duration) RetryPolicy {
	return RetryPolicy{Kind: RetryExponential, Retries: n, Interval: initial, MaxInterval: max, Multiplier: 2, RandomizationFactor: 0.2}
}

// DefaultRetry is the policy of an endpoint that sets none: 3 retries with
// exponential delays from 100ms up to 2s.
func DefaultRetry() RetryPolicy { return Exponential(3, 100*time.Millisecond, 2*time.Second) }

// Validate reports what is wrong with the policy.
func (p RetryPolicy) Validate() error {
	switch {
	case p.Kind != 0 && (p.Kind < RetryNone || p.Kind > RetryExponential):
		return fmt.Errorf("unknown retry kind %d", p.Kind)
	case p.Retries < 0:
		return fmt.Errorf("retry count %d is negative; use NoRetry() for none", p.Retries)
	case p.Kind != RetryNone && p.Kind != RetryImmediate && p.Interval <= 0:
		return fmt.Errorf("retry interval %v must be positive", p.Interval)
	case p.Increment < 0:
		return fmt.Errorf("retry increment %v is negative", p.Increment)
	case p.MaxInterval < 0:
		return fmt.Errorf("retry max interval %v is negative", p.MaxInterval)
	case p.Multiplier != 0 && p.Multiplier < 1:
		return fmt.Errorf("retry multiplier %v must be >= 1", p.Multiplier)
	case p.RandomizationFactor < 0 || p.RandomizationFactor > 1:
		return fmt.Errorf("retry randomization factor %v must be within [0, 1]", p.RandomizationFactor)
	}
	return nil
}
