package inbox

import (
	"context"
	"errors"
	"time"
)

// BatchStore is implemented by stores that can group-commit: lock the inbox
// entries of several deliveries of one consumer type in one statement, and
// process them in one transaction, each handler inside its own savepoint.
// The bus uses it when the store has it (gormstore does); otherwise every
// delivery goes through Store alone. inbox/inboxtest checks both.
type BatchStore interface {
	// TryLockBatch is TryLock for every id of one consumer type, in one
	// committed transaction: one Lock per id, in order. A Lock is Acquired
	// (the caller holds it and must process or release it), Processed (a
	// duplicate), or Busy: not locked by this call and not processed, which
	// covers an unexpired lock of another delivery, an id repeated in ids
	// (only its first occurrence can be locked) and an entry that changed
	// under contention; the caller settles a Busy id with TryLock.
	TryLockBatch(ctx context.Context, consumerType string, ids []string, timeout time.Duration) ([]Lock, error)
	// ProcessBatch runs items in one transaction and returns one error per
	// item. First it re-checks every token under a row lock: an item whose
	// token no longer holds its entry (taken over after its lock expired)
	// gets ErrLockLost and does not run. Then each item's Fn runs inside its
	// own savepoint with a ctx carrying the transaction (derived from the
	// item's Ctx): a failing Fn is rolled back to its savepoint, its lock is
	// released, and its error is its result; its neighbours go on. Once
	// the transaction has lasted until `until` (zero: no bound), the items
	// not started yet get ErrNotStarted and keep their locks, for the
	// caller to process in another batch. The entries of the items that
	// succeeded are marked processed in one statement, then the transaction
	// commits: their result is nil. When beginning, marking or committing
	// fails, every item that had not failed by itself gets a *StoreError and
	// every lock of the batch is released (best effort: a lock not released
	// expires).
	ProcessBatch(ctx context.Context, consumerType string, items []BatchItem, until time.Time) []error
}

// BatchItem is one delivery of a ProcessBatch call.
type BatchItem struct {
	// MessageID and Token identify the entry and its lock (TryLockBatch).
	MessageID string
	Token     string
	// Ctx is the context Fn runs with (the transaction is added to it); its
	// deadline bounds Fn's statements.
	Ctx context.Context
	// Timeout, when positive, bounds Fn from the moment it starts (the
	// endpoint's HandlerTimeout): Fn's ctx and statements end then.
	Timeout time.Duration
	// Fn is the handler. It must use the transaction carried by its ctx.
	Fn func(ctx context.Context) error
}

// ErrNotStarted is ProcessBatch's result for an item that did not run
// because the batch reached its time bound first; the item keeps its lock.
var ErrNotStarted = errors.New("inbox: batch reached its time bound before this message started; it goes in the next batch")
