package inbox

import (
	"context"
	"errors"
	"time"
)

// Key identifies an inbox entry: one message as seen by one consumer.
type Key struct {
	MessageID    string
	ConsumerType string
}

// State is the outcome of TryLock.
type State int

const (
	// Acquired: the caller holds the lock and must process, then mark or release.
	Acquired State = iota + 1
	// Processed: the message was already processed by this consumer (a duplicate).
	Processed
	// Busy: another delivery holds an unexpired lock.
	Busy
)

func (s State) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case Processed:
		return "processed"
	case Busy:
		return "busy"
	}
	return "unknown"
}

// Lock is the result of TryLock.
type Lock struct {
	State State
	// Token fences the holder: only the holder of the current token can mark
	// the entry processed. Set when State is Acquired.
	Token string
	// ExpiresAt is when the current lock expires (database clock).
	ExpiresAt time.Time
}

// Entry is an inbox row as shown by inspection.
type Entry struct {
	MessageID    string
	ConsumerType string
	ReceivedAt   time.Time
	ProcessedAt  *time.Time
	ExpiresAt    time.Time
	Attempts     int
}

// Query filters List.
type Query struct {
	MessageID    string
	ConsumerType string
	// Processed filters by processed state when not nil.
	Processed *bool
	// Offset and Limit page the result (newest received first); Limit 0 means 100.
	Offset int
	Limit  int
}

// Store is what the inbox needs from a database. gormstore implements it for
// PostgreSQL and SQLite; inbox/inboxtest is its conformance suite. All times
// come from the database's clock.
type Store interface {
	// TryLock, in its own committed transaction, inserts the entry locked for
	// timeout, or re-locks it when it exists unprocessed with an expired lock
	// (a conditional update; only one concurrent caller can win). It reports
	// Processed for a processed entry and Busy for an unexpired lock.
	TryLock(ctx context.Context, key Key, timeout time.Duration) (Lock, error)
	// Process runs fn in one transaction (carried by the ctx passed to fn, the
	// same transaction outbox.Store.Add finds) and, if fn succeeds, marks the
	// entry processed guarded by token, then commits. When the token no longer
	// holds the lock it rolls back and returns ErrLockLost. When fn fails it
	// rolls back and returns fn's error.
	Process(ctx context.Context, key Key, token string, fn func(ctx context.Context) error) error
	// ProcessAndLock is the one-transaction variant: it inserts the entry as
	// processed and runs fn in the same transaction. It returns (false, nil)
	// without calling fn when the entry already exists (a duplicate or a
	// concurrent delivery). Concurrent deliveries of one key serialize on the
	// row, so it is meant for short handlers.
	ProcessAndLock(ctx context.Context, key Key, fn func(ctx context.Context) error) (bool, error)
	// Release drops a lock held with token so that a retry can take it at
	// once. It returns ErrLockLost when token no longer holds the entry (it
	// was taken over, processed, or released already): nothing changed.
	Release(ctx context.Context, key Key, token string) error
	// Cleanup deletes at most batch entries processed more than retention ago,
	// or never processed and expired more than retention ago. It returns how
	// many it deleted.
	Cleanup(ctx context.Context, retention time.Duration, batch int) (int, error)
	// List returns entries matching q.
	List(ctx context.Context, q Query) ([]Entry, error)
	// Stats counts entries.
	Stats(ctx context.Context) (Stats, error)
}

// LockProcessor is implemented by stores that can take the lock and run
// the processing transaction with fewer round trips than TryLock followed
// by Process (gormstore on PostgreSQL with the postgresdb.Pipeline plugin
// sends the lock with the BEGIN, and the processed mark with the COMMIT).
// The two-phase middleware uses it when the store has it.
type LockProcessor interface {
	// LockAndProcess is TryLock followed, when the lock was acquired, by
	// Process with its token, with their guarantees: the lock commits on
	// its own before the processing transaction begins. The Lock's State
	// says what happened: Processed and Busy as TryLock's (fn did not
	// run, the error is nil); Acquired: fn ran, or was about to, and the
	// error is Process's; the Lock names the token to release when that
	// error is not ErrLockLost. A zero State with an error: taking the
	// lock failed and no lock is held.
	LockAndProcess(ctx context.Context, key Key, timeout time.Duration, fn func(ctx context.Context) error) (Lock, error)
}

// Stats are inbox counts.
//
// Processed entries are not counted: they are history, and counting them
// would cost health checks and metric scrapes a scan of every entry kept
// for InboxRetention (list them with Query.Processed).
type Stats struct {
	// Locked counts unprocessed entries whose lock has not expired.
	Locked int64
	// Expired counts unprocessed entries whose lock expired (crashed or
	// abandoned deliveries waiting for a redelivery).
	Expired int64
}

// ErrLockLost is returned by Process when the lock expired and another
// delivery took it over: the transaction was rolled back.
var ErrLockLost = errors.New("inbox: lock lost to another delivery (InboxLockTimeout exceeded); transaction rolled back")

// ErrBusy is returned by the middleware for a message whose inbox entry is
// locked by another delivery; the message goes back to the broker.
var ErrBusy = errors.New("inbox: message is being processed by another delivery; requeued")

// StoreError wraps a failure of the inbox's own database work (taking,
// marking or releasing a lock; beginning or committing the transaction), as
// opposed to a failure of the consumer. The bus requeues such messages
// instead of dead-lettering them: the message is fine, the database is not.
type StoreError struct {
	Op  string
	Err error
}

func (e *StoreError) Error() string { return "inbox: " + e.Op + ": " + e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }
