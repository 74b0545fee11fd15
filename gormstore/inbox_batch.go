package gormstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/detach"
	"github.com/barewire-go/barewire/internal/pgerr"
)

var _ inbox.BatchStore = (*Inbox)(nil)

// MaxInboxBatch is the most deliveries TryLockBatch and ProcessBatch take
// at once. Each item of ProcessBatch opens a savepoint, a PostgreSQL
// subtransaction; past 64 in one transaction a backend's subtransaction
// cache overflows and every snapshot of every session gets slower.
const MaxInboxBatch = 64

// The statements of the batch methods depend on the number of deliveries;
// each is built once per size and kind.
type batchKind int

const (
	batchLock batchKind = iota
	batchRead
	batchFence
	batchMark
	batchRelease
)

type batchStmts struct {
	mu sync.Mutex
	m  map[[2]int]string
}

// placeholders returns "?, ?, …" with n marks.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// batchSQL returns the statement of kind for n deliveries, in the dialect's
// bind form.
func (in *Inbox) batchSQL(kind batchKind, n int) string {
	in.batch.mu.Lock()
	defer in.batch.mu.Unlock()
	if q, ok := in.batch.m[[2]int{int(kind), n}]; ok {
		return q
	}
	if in.batch.m == nil {
		in.batch.m = map[[2]int]string{}
	}
	s := in.s
	pg := s.dialect.name == DialectPostgres
	// Rows are found through the primary key (message_id, consumer_type);
	// the tokens, unique per lock, are the fence.
	held := "consumer_type = ? AND message_id IN (" + placeholders(n) + ") AND lock_token IN (" + placeholders(n) + ") AND processed_at IS NULL"
	var q string
	switch kind {
	case batchLock:
		// One upsert for the batch: the conditional DO UPDATE takes over
		// only released or expired unprocessed entries, as TryLock's does.
		// On PostgreSQL it commits asynchronously, as TryLock's does (the
		// processing transaction's synchronous commit flushes it).
		values := strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ")
		from := "(VALUES " + values + ") AS v"
		if pg {
			from += " CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true), set_config('lock_timeout', '" + lockWaitSetting + "', true)) AS async_commit"
		}
		// WHERE true: SQLite needs it to parse an upsert of a SELECT.
		q = `INSERT INTO {inbox} (message_id, consumer_type, received_at, expires_at, lock_token, attempts)
SELECT CAST(v.column1 AS TEXT), CAST(? AS TEXT), {now}, {now+?}, CAST(v.column2 AS TEXT), 1 FROM ` + from + ` WHERE true
ON CONFLICT (message_id, consumer_type) DO UPDATE
SET expires_at = excluded.expires_at, lock_token = excluded.lock_token, attempts = {inbox}.attempts + 1
WHERE ` + lockable + `
RETURNING message_id, expires_at`
	case batchRead:
		q = `SELECT message_id, processed_at, expires_at, CASE WHEN ` + lockable + ` THEN 1 ELSE 0 END AS relockable
FROM {inbox} WHERE consumer_type = ? AND message_id IN (` + placeholders(n) + `)`
	case batchFence:
		// Locks the rows still held by the batch's tokens for the rest of
		// the transaction, so that none can be taken over before the mark:
		// FOR UPDATE on PostgreSQL, a no-op write (SQLite's database lock)
		// on SQLite.
		if pg {
			q = `SELECT message_id FROM {inbox} WHERE ` + held + ` FOR UPDATE`
		} else {
			q = `UPDATE {inbox} SET expires_at = expires_at WHERE ` + held + ` RETURNING message_id`
		}
	case batchMark:
		q = `UPDATE {inbox} SET processed_at = ` + s.markClock() + `, lock_token = NULL WHERE ` + held
	case batchRelease:
		q = `UPDATE {inbox} SET lock_token = NULL, expires_at = {now} WHERE ` + held
	}
	q = s.dialect.bind(s.query(q))
	in.batch.m[[2]int{int(kind), n}] = q
	return q
}

// heldArgs are the arguments of the fence, mark and release statements.
func heldArgs(consumerType string, ids, tokens []string) []any {
	args := make([]any, 0, 1+2*len(ids))
	args = append(args, consumerType)
	for _, id := range ids {
		args = append(args, id)
	}
	for _, t := range tokens {
		args = append(args, t)
	}
	return args
}

// TryLockBatch implements inbox.BatchStore: one upsert for every id, then,
// when some were not locked, one read of those.
func (in *Inbox) TryLockBatch(ctx context.Context, consumerType string, ids []string, timeout time.Duration) ([]inbox.Lock, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("gormstore: inbox lock timeout must be positive, got %v", timeout)
	}
	if len(ids) > MaxInboxBatch {
		return nil, fmt.Errorf("gormstore: inbox batch of %d ids; at most %d", len(ids), MaxInboxBatch)
	}
	locks := make([]inbox.Lock, len(ids))
	if len(ids) == 0 {
		return locks, nil
	}
	// An id repeated in the batch is Busy: one statement cannot upsert a
	// row twice, and its first occurrence holds the lock.
	first := make(map[string]int, len(ids))
	var uniq []int
	for i, id := range ids {
		if _, dup := first[id]; dup {
			locks[i] = inbox.Lock{State: inbox.Busy}
			continue
		}
		first[id] = i
		uniq = append(uniq, i)
	}
	args := make([]any, 0, 2+2*len(uniq))
	args = append(args, consumerType, in.s.dialect.shift(timeout))
	tokens := make(map[string]string, len(uniq))
	for _, i := range uniq {
		tok := uuid.NewString()
		tokens[ids[i]] = tok
		args = append(args, ids[i], tok)
	}
	// A row of the batch held by another transaction past lockWait fails
	// the whole statement, which locked nothing: every id is busy (the
	// caller tries each alone).
	allBusy := func() ([]inbox.Lock, error) {
		for i := range locks {
			locks[i] = inbox.Lock{State: inbox.Busy, ExpiresAt: time.Now().Add(lockWait)}
		}
		return locks, nil
	}
	rows, err := querySQL(ctx, in.s.db, in.batchSQL(batchLock, len(uniq)), args...)
	if lockWaitEnded(err) {
		return allBusy()
	}
	if err != nil {
		return nil, fmt.Errorf("gormstore: inbox lock batch of %d: %w", len(uniq), err)
	}
	locked := 0
	for rows.Next() {
		var id string
		var exp dbTime
		if err := rows.Scan(&id, &exp); err != nil {
			_ = rows.Close()
			return nil, fmt.Errorf("gormstore: inbox lock batch of %d: %w", len(uniq), err)
		}
		if i, ok := first[id]; ok {
			locks[i] = inbox.Lock{State: inbox.Acquired, Token: tokens[id], ExpiresAt: exp.Time}
			locked++
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		if lockWaitEnded(err) {
			return allBusy()
		}
		return nil, fmt.Errorf("gormstore: inbox lock batch of %d: %w", len(uniq), err)
	}
	if locked == len(uniq) {
		return locks, nil
	}
	// Tell the processed (duplicates) from the rest.
	var rest []any
	rest = append(rest, consumerType)
	for _, i := range uniq {
		if locks[i].State != inbox.Acquired {
			locks[i] = inbox.Lock{State: inbox.Busy}
			rest = append(rest, ids[i])
		}
	}
	rows, err = querySQL(ctx, in.s.db, in.batchSQL(batchRead, len(rest)-1), rest...)
	if err != nil {
		return nil, fmt.Errorf("gormstore: inbox read batch of %d: %w", len(rest)-1, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var processedAt, expiresAt dbTime
		var rel int
		if err := rows.Scan(&id, &processedAt, &expiresAt, &rel); err != nil {
			return nil, fmt.Errorf("gormstore: inbox read batch: %w", err)
		}
		i, ok := first[id]
		if !ok || locks[i].State == inbox.Acquired {
			continue
		}
		if processedAt.Valid {
			locks[i] = inbox.Lock{State: inbox.Processed, ExpiresAt: expiresAt.Time}
		} else {
			locks[i] = inbox.Lock{State: inbox.Busy, ExpiresAt: expiresAt.Time}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("gormstore: inbox read batch: %w", err)
	}
	return locks, nil
}

// savepoint is the name every item's savepoint takes. Savepoints are never
// released: each is nested in the previous one, so rolling back to the
// latest undoes only the latest item's work, and not releasing saves a
// round trip per item.
const savepoint = "bw_item"

// ProcessBatch implements inbox.BatchStore. A panic in an item's Fn rolls
// the whole transaction back, releases the batch's locks and propagates.
func (in *Inbox) ProcessBatch(ctx context.Context, consumerType string, items []inbox.BatchItem, until time.Time) []error {
	errs := make([]error, len(items))
	if len(items) == 0 {
		return errs
	}
	if len(items) > MaxInboxBatch {
		for i := range errs {
			errs[i] = fmt.Errorf("gormstore: inbox batch of %d items; at most %d", len(items), MaxInboxBatch)
		}
		return errs
	}
	ids := make([]string, len(items))
	tokens := make([]string, len(items))
	for i, it := range items {
		ids[i], tokens[i] = it.MessageID, it.Token
	}
	// fail gives every item that has no result of its own err, and
	// releases every lock of the batch outside the failed transaction.
	fail := func(tx *gorm.DB, op string, err error) []error {
		if tx != nil {
			_ = tx.Rollback().Error
		}
		for i := range errs {
			if errs[i] == nil || errors.Is(errs[i], inbox.ErrNotStarted) {
				errs[i] = &inbox.StoreError{Op: op, Err: err}
			}
		}
		in.releaseDetached(ctx, consumerType, ids, tokens)
		return errs
	}

	tx := in.s.db.WithContext(ctx).Begin()
	if tx.Error != nil {
		return fail(nil, "begin batch", tx.Error)
	}
	committed := false
	defer func() {
		if !committed {
			if v := recover(); v != nil {
				_ = tx.Rollback().Error
				in.releaseDetached(ctx, consumerType, ids, tokens)
				panic(v)
			}
		}
	}()

	// The fence: which tokens still hold their entries, now locked until
	// the commit.
	rows, err := querySQL(ctx, tx, in.batchSQL(batchFence, len(items)), heldArgs(consumerType, ids, tokens)...)
	if err != nil {
		return fail(tx, "lock batch entries", err)
	}
	held := make(map[string]bool, len(items))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return fail(tx, "lock batch entries", err)
		}
		held[id] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fail(tx, "lock batch entries", err)
	}

	var okIdx, failedIdx []int
	last := -1 // the latest item that succeeded with no savepoint opened since
	// blame rolls back to the latest savepoint when a statement found the
	// transaction aborted by the latest item (a consumer that ignored a
	// failed statement): that item fails, the others stand.
	blame := func(err error) bool {
		if last < 0 || !abortedTx(err) {
			return false
		}
		if _, rerr := execSQL(ctx, tx, "ROLLBACK TO SAVEPOINT "+savepoint); rerr != nil {
			return false
		}
		errs[last] = &inbox.StoreError{Op: "statement after the consumer", Err: err}
		okIdx = okIdx[:len(okIdx)-1]
		failedIdx = append(failedIdx, last)
		last = -1
		return true
	}
	ran := 0
	for i, it := range items {
		if !held[it.MessageID] {
			errs[i] = inbox.ErrLockLost
			continue
		}
		if ran > 0 && !until.IsZero() && !time.Now().Before(until) {
			errs[i] = inbox.ErrNotStarted
			continue
		}
		ran++
		_, err := execSQL(ctx, tx, "SAVEPOINT "+savepoint)
		if err != nil && blame(err) {
			_, err = execSQL(ctx, tx, "SAVEPOINT "+savepoint)
		}
		if err != nil {
			return fail(tx, "savepoint", err)
		}
		if fnErr := runItem(tx, it); fnErr != nil {
			if _, err := execSQL(ctx, tx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
				errs[i] = fnErr
				return fail(tx, "rollback to savepoint", err)
			}
			errs[i] = fnErr
			failedIdx = append(failedIdx, i)
			last = -1
			continue
		}
		okIdx = append(okIdx, i)
		last = i
	}

	for len(okIdx) > 0 {
		n, err := in.execHeld(ctx, tx, batchMark, consumerType, ids, tokens, okIdx)
		if err != nil && blame(err) {
			continue
		}
		if err != nil {
			return fail(tx, "mark batch processed", err)
		}
		if n != int64(len(okIdx)) {
			// Impossible while the fence holds the rows; should it happen,
			// nothing of the batch commits and each delivery looks again.
			_ = tx.Rollback().Error
			committed = true // no panic can follow
			for _, i := range okIdx {
				errs[i] = inbox.ErrLockLost
			}
			in.releaseDetached(ctx, consumerType, ids, tokens)
			return errs
		}
		break
	}
	if len(failedIdx) > 0 {
		// The failed items' locks go with the commit, so that their
		// retries can take them at once.
		if _, err := in.execHeld(ctx, tx, batchRelease, consumerType, ids, tokens, failedIdx); err != nil {
			return fail(tx, "release failed items", err)
		}
	}
	if err := tx.Commit().Error; err != nil {
		committed = true
		return fail(nil, "commit batch", err)
	}
	committed = true
	return errs
}

// runItem runs an item's Fn with its ctx (bounded by its Timeout from now)
// and the transaction, whose statements then run with that ctx.
func runItem(tx *gorm.DB, it inbox.BatchItem) error {
	ctx := it.Ctx
	if it.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, it.Timeout)
		defer cancel()
	}
	return it.Fn(WithTx(ctx, tx.WithContext(ctx)))
}

// execHeld runs the mark or release statement for the items at idx.
func (in *Inbox) execHeld(ctx context.Context, tx *gorm.DB, kind batchKind, consumerType string, ids, tokens []string, idx []int) (int64, error) {
	sel := make([]string, len(idx))
	selTok := make([]string, len(idx))
	for j, i := range idx {
		sel[j], selTok[j] = ids[i], tokens[i]
	}
	res, err := execSQL(ctx, tx, in.batchSQL(kind, len(idx)), heldArgs(consumerType, sel, selTok)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// releaseBatch drops the locks of a batch that did not commit, so that the
// retries can take them at once; if it fails, they expire.
func (in *Inbox) releaseBatch(ctx context.Context, consumerType string, ids, tokens []string) {
	_, _ = execSQL(ctx, in.s.db, in.batchSQL(batchRelease, len(ids)), heldArgs(consumerType, ids, tokens)...)
}

// abortedTx reports whether a statement failed because an earlier one
// aborted the PostgreSQL transaction (SQLSTATE 25P02).
func abortedTx(err error) bool { return pgerr.SQLState(err) == "25P02" }

// releaseDetached releases a batch's locks after its context was canceled
// or its statement failed, within detach.Timeout.
func (in *Inbox) releaseDetached(ctx context.Context, consumerType string, ids, tokens []string) {
	rctx, cancel := detach.From(ctx)
	defer cancel()
	in.releaseBatch(rctx, consumerType, ids, tokens)
}
