package gormstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/pgerr"
)

var _ inbox.LockProcessor = (*Inbox)(nil)

// markOrFailSQL is the processed mark sent with the COMMIT: it fails
// (division by zero, SQLSTATE 22012) when the token no longer holds the
// entry, so that PostgreSQL skips the COMMIT that follows it in the same
// write. The plain mark's "0 rows" would come back only after the COMMIT.
const markOrFailSQL = `WITH m AS (UPDATE {inbox} SET processed_at = clock_timestamp(), lock_token = NULL
WHERE message_id = ? AND consumer_type = ? AND lock_token = ? AND processed_at IS NULL RETURNING 1)
SELECT 1 / COUNT(*) FROM m`

// lockLostState is the SQLSTATE markOrFailSQL fails with.
const lockLostState = "22012"

// LockAndProcess implements inbox.LockProcessor: TryLock, then, when it
// acquired the lock, Process with its token. On PostgreSQL with the
// PipelinePlugin plugin (an InboxPipeliner, such as postgresdb.Pipeline)
// it costs two round trips around fn's statements instead of four: the
// lock (its own transaction, committed before the BEGIN) and the BEGIN go
// in one write, the processed mark, the outbox rows fn published (kept
// as in Outbox.Begin's transactions) and the COMMIT in another. A mark
// that finds the lock lost fails and the COMMIT is skipped: ErrLockLost,
// as Process. Elsewhere, and when the lock found an existing entry, it
// runs TryLock and Process.
//
// The transaction runs on a connection of the *sql.DB under the store's
// pool, as Outbox.Begin's do: a custom gorm.ConnPool's BeginTx is not
// called for it (registering the plugin opts in to that).
func (in *Inbox) LockAndProcess(ctx context.Context, key inbox.Key, timeout time.Duration, fn func(ctx context.Context) error) (inbox.Lock, error) {
	if timeout <= 0 {
		return inbox.Lock{}, fmt.Errorf("gormstore: inbox lock timeout must be positive, got %v", timeout)
	}
	d, lock, err := in.lockBegin(ctx, key, timeout)
	switch {
	case err != nil:
		return lock, err
	case d == nil: // no pipelined path, or the entry exists: the plain way
		lock, err = in.TryLock(ctx, key, timeout)
		if err != nil || lock.State != inbox.Acquired {
			return lock, err
		}
		return lock, in.Process(ctx, key, lock.Token, fn)
	}
	return lock, in.processDeferred(ctx, d, key, lock.Token, fn)
}

// lockBegin runs the lock upsert and BEGIN in one write. It returns a nil
// DeferredTx when that cannot be done here or the upsert locked nothing
// (the transaction is then rolled back). On an error a lock may have been
// taken before the failure: the Lock it returns then names its token, for
// the caller to release.
func (in *Inbox) lockBegin(ctx context.Context, key inbox.Key, timeout time.Duration) (*DeferredTx, inbox.Lock, error) {
	if in.s.dialect.name != DialectPostgres {
		return nil, inbox.Lock{}, nil
	}
	c, p, sqlDB, err := pipelineConn(ctx, in.s.db)
	if err != nil {
		return nil, inbox.Lock{}, fmt.Errorf("gormstore: inbox lock %s/%s: %w", key.MessageID, key.ConsumerType, err)
	}
	if c == nil {
		return nil, inbox.Lock{}, nil
	}
	ip, ok := p.(InboxPipeliner)
	if !ok {
		_ = c.Close()
		return nil, inbox.Lock{}, nil
	}
	token := uuid.NewString()
	var exp dbTime
	got := false
	err = c.Raw(func(dc any) error {
		return ip.RunThenBegin(ctx, dc, in.tryLockSQL, []any{key.MessageID, key.ConsumerType, in.s.dialect.shift(timeout), token}, func() []any {
			got = true
			return []any{&exp}
		})
	})
	d := &DeferredTx{o: in.s.outbox, db: sqlDB, conn: c, pipe: p}
	if lockWaitEnded(err) {
		// The entry's row is held by another transaction: nothing locked;
		// TryLock says busy.
		d.done = true
		_ = d.end(ctx)
		return nil, inbox.Lock{}, nil
	}
	if err != nil {
		d.done = true
		_ = d.end(ctx)
		return nil, inbox.Lock{State: inbox.Acquired, Token: token}, fmt.Errorf("gormstore: inbox lock %s/%s and begin: %w", key.MessageID, key.ConsumerType, err)
	}
	if !got {
		d.done = true
		if err := d.end(ctx); err != nil {
			return nil, inbox.Lock{}, fmt.Errorf("gormstore: inbox lock %s/%s: rollback: %w", key.MessageID, key.ConsumerType, err)
		}
		return nil, inbox.Lock{}, nil
	}
	d.first = []Statement{{SQL: in.markOrFailSQL, Args: []any{key.MessageID, key.ConsumerType, token}}}
	return d, inbox.Lock{State: inbox.Acquired, Token: token, ExpiresAt: exp.Time}, nil
}

// processDeferred runs fn in d and commits it with the processed mark.
func (in *Inbox) processDeferred(ctx context.Context, d *DeferredTx, key inbox.Key, token string, fn func(ctx context.Context) error) (err error) {
	panicked := true
	defer func() {
		if panicked {
			_ = d.Rollback()
		}
	}()
	err = fn(WithTx(ctx, d.session(ctx, in.s.db)))
	panicked = false
	if err != nil {
		_ = d.Rollback() // ErrTxDone if fn ended it itself
		return err
	}
	if err := d.CommitContext(ctx); err != nil {
		if pgerr.SQLState(err) == lockLostState {
			return inbox.ErrLockLost
		}
		return fmt.Errorf("gormstore: inbox mark %s/%s processed and commit: %w", key.MessageID, key.ConsumerType, err)
	}
	return nil
}
