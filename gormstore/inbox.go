package gormstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/pgerr"
)

// Inbox implements inbox.Store on the <prefix>inbox table. Obtain it from
// Store.Inbox.
type Inbox struct {
	s *Store

	tryLockSQL        string
	readSQL           string
	markSQL           string
	markOrFailSQL     string
	processAndLockSQL string
	releaseSQL        string
	forceReleaseSQL   string
	cleanupSQL        string
	statsSQL          string
	listSQL           string

	batch batchStmts // the statements of TryLockBatch and ProcessBatch, by size
}

// inboxRow is the GORM model of an inbox row, used for scans.
type inboxRow struct {
	MessageID    string  `gorm:"column:message_id"`
	ConsumerType string  `gorm:"column:consumer_type"`
	ReceivedAt   dbTime  `gorm:"column:received_at"`
	ProcessedAt  dbTime  `gorm:"column:processed_at"`
	ExpiresAt    dbTime  `gorm:"column:expires_at"`
	LockToken    *string `gorm:"column:lock_token"`
	Attempts     int     `gorm:"column:attempts"`
}

func (r inboxRow) entry() inbox.Entry {
	return inbox.Entry{
		MessageID:    r.MessageID,
		ConsumerType: r.ConsumerType,
		ReceivedAt:   r.ReceivedAt.Time,
		ProcessedAt:  r.ProcessedAt.ptr(),
		ExpiresAt:    r.ExpiresAt.Time,
		Attempts:     r.Attempts,
	}
}

// lockWait bounds how long an inbox lock statement waits for a row lock
// held by another transaction (PostgreSQL's lock_timeout, set in the
// statement itself: no extra round trip).
const lockWait = time.Second

// lockWaitSetting is lockWait as the statements set lock_timeout to.
var lockWaitSetting = strconv.FormatInt(lockWait.Milliseconds(), 10) + "ms"

// lockWaitEnded reports whether err is a lock statement giving up after
// lockWait (SQLSTATE 55P03, lock_not_available).
func lockWaitEnded(err error) bool { return err != nil && pgerr.SQLState(err) == "55P03" }

// lockable is the condition under which an existing row may be locked by a
// new delivery: unprocessed, and either released (no token) or expired.
const lockable = "{inbox}.processed_at IS NULL AND ({inbox}.lock_token IS NULL OR {inbox}.expires_at <= {now})"

func newInbox(s *Store) *Inbox {
	in := &Inbox{s: s}
	// One statement both inserts a new lock and takes over an expired one:
	// the conditional DO UPDATE runs on the latest row version under its row
	// lock, so of several concurrent callers exactly one gets a row back.
	values := "VALUES (?, ?, {now}, {now+?}, ?, 1)"
	if s.dialect.name == DialectPostgres {
		// The lock commits asynchronously (no fsync of its own): the
		// processing transaction's synchronous commit flushes the WAL up to
		// and including it, and a lock lost in a crash before that is just
		// an expired lock. One fsync per message instead of two.
		//
		// The lock waits at most lockWait for a row lock another
		// transaction holds on the entry (a group-commit batch's fence, a
		// frozen process's open transaction): past it the entry is busy,
		// not a wait without limit.
		values = "SELECT ?, ?, {now}, {now+?}, ?, 1 FROM (SELECT set_config('synchronous_commit', 'off', true), set_config('lock_timeout', '" + lockWaitSetting + "', true)) AS async_commit"
	}
	in.tryLockSQL = s.dialect.bind(s.query(`INSERT INTO {inbox} (message_id, consumer_type, received_at, expires_at, lock_token, attempts)
` + values + `
ON CONFLICT (message_id, consumer_type) DO UPDATE
SET expires_at = excluded.expires_at, lock_token = excluded.lock_token, attempts = {inbox}.attempts + 1
WHERE ` + lockable + `
RETURNING expires_at`))
	in.readSQL = s.dialect.bind(s.query(`SELECT processed_at, expires_at, lock_token,
CASE WHEN ` + lockable + ` THEN 1 ELSE 0 END AS relockable
FROM {inbox} WHERE message_id = ? AND consumer_type = ?`))
	in.markSQL = s.dialect.bind(s.query(`UPDATE {inbox} SET processed_at = ` + s.markClock() + `, lock_token = NULL
WHERE message_id = ? AND consumer_type = ? AND lock_token = ? AND processed_at IS NULL`))
	in.markOrFailSQL = s.dialect.bind(s.query(markOrFailSQL))
	// Takes over an abandoned (released or expired) lock too: such an entry
	// is neither a duplicate nor a live concurrent delivery, and reporting it
	// as existing would get the message acknowledged unprocessed.
	in.processAndLockSQL = s.dialect.bind(s.query(`INSERT INTO {inbox} (message_id, consumer_type, received_at, processed_at, expires_at, lock_token, attempts)
VALUES (?, ?, {now}, {now}, {now}, NULL, 1)
ON CONFLICT (message_id, consumer_type) DO UPDATE
SET processed_at = excluded.processed_at, expires_at = excluded.expires_at, lock_token = NULL, attempts = {inbox}.attempts + 1
WHERE ` + lockable))
	// Setting expires_at to now keeps the attempt count (deleting the row
	// would lose it) while the NULL token makes the row lockable at once.
	in.releaseSQL = s.dialect.bind(s.query(`UPDATE {inbox} SET lock_token = NULL, expires_at = {now}
WHERE message_id = ? AND consumer_type = ? AND lock_token = ? AND processed_at IS NULL`))
	in.forceReleaseSQL = s.query(`UPDATE {inbox} SET lock_token = NULL, expires_at = {now}
WHERE message_id = ? AND consumer_type = ? AND processed_at IS NULL AND lock_token IS NOT NULL`)
	const cleanupWhere = `(processed_at IS NOT NULL AND processed_at < {now+?})
   OR (processed_at IS NULL AND expires_at < {now+?})`
	if s.dialect.name == DialectPostgres {
		// SKIP LOCKED lets several instances clean up at once: each takes
		// rows the others have not locked instead of waiting (or
		// deadlocking) on them.
		in.cleanupSQL = s.query(`DELETE FROM {inbox} WHERE (message_id, consumer_type) IN (
SELECT message_id, consumer_type FROM {inbox}
WHERE ` + cleanupWhere + `
LIMIT ? FOR UPDATE SKIP LOCKED)`)
	} else {
		in.cleanupSQL = s.query(`DELETE FROM {inbox} WHERE rowid IN (
SELECT rowid FROM {inbox}
WHERE ` + cleanupWhere + `
LIMIT ?)`)
	}
	// Separate counts so that each can use its partial index.
	in.statsSQL = s.query(`SELECT
(SELECT COUNT(*) FROM {inbox} WHERE processed_at IS NULL AND lock_token IS NOT NULL AND expires_at > {now}) AS locked,
(SELECT COUNT(*) FROM {inbox} WHERE processed_at IS NULL AND (lock_token IS NULL OR expires_at <= {now})) AS expired`)
	in.listSQL = s.query(`SELECT message_id, consumer_type, received_at, processed_at, expires_at, lock_token, attempts FROM {inbox}`)
	return in
}

// markClock is the time written as processed_at. On PostgreSQL it is the
// statement's clock rather than now(): Process marks at the end of a
// transaction that may have run a long handler.
func (s *Store) markClock() string {
	if s.dialect.name == DialectPostgres {
		return "clock_timestamp()"
	}
	return "{now}"
}

// TryLock implements inbox.Store. It runs one upsert (its own transaction)
// and, when that did not lock, reads the row to tell Processed from Busy.
func (in *Inbox) TryLock(ctx context.Context, key inbox.Key, timeout time.Duration) (inbox.Lock, error) {
	if timeout <= 0 {
		return inbox.Lock{}, fmt.Errorf("gormstore: inbox lock timeout must be positive, got %v", timeout)
	}
	// The row can change between the upsert and the read (released, cleaned
	// up or expired in between); a few rounds settle it.
	shift := in.s.dialect.shift(timeout)
	for range 5 {
		token := uuid.NewString()
		acquired, expiresAt, err := in.tryLockOnce(ctx, key, shift, token)
		if lockWaitEnded(err) {
			// Another transaction holds the entry's row: busy, look again.
			return inbox.Lock{State: inbox.Busy, ExpiresAt: time.Now().Add(lockWait)}, nil
		}
		if err != nil {
			return inbox.Lock{}, fmt.Errorf("gormstore: inbox lock %s/%s: %w", key.MessageID, key.ConsumerType, err)
		}
		if acquired {
			return inbox.Lock{State: inbox.Acquired, Token: token, ExpiresAt: expiresAt}, nil
		}

		found, processedAt, until, relockable, err := in.read(ctx, key)
		if err != nil {
			return inbox.Lock{}, fmt.Errorf("gormstore: inbox read %s/%s: %w", key.MessageID, key.ConsumerType, err)
		}
		switch {
		case !found || relockable:
			continue // deleted or freed since the upsert: try again
		case processedAt.Valid:
			return inbox.Lock{State: inbox.Processed, ExpiresAt: until.Time}, nil
		default:
			return inbox.Lock{State: inbox.Busy, ExpiresAt: until.Time}, nil
		}
	}
	return inbox.Lock{}, fmt.Errorf("gormstore: inbox lock %s/%s: entry kept changing under contention", key.MessageID, key.ConsumerType)
}

// tryLockOnce runs the lock upsert (its own transaction): acquired says
// whether it locked the entry, until expiresAt.
func (in *Inbox) tryLockOnce(ctx context.Context, key inbox.Key, shift any, token string) (acquired bool, expiresAt time.Time, err error) {
	rows, err := querySQL(ctx, in.s.db, in.tryLockSQL, key.MessageID, key.ConsumerType, shift, token)
	if err != nil {
		return false, time.Time{}, err
	}
	defer rows.Close()
	if rows.Next() {
		var exp dbTime
		if err := rows.Scan(&exp); err != nil {
			return false, time.Time{}, err
		}
		acquired, expiresAt = true, exp.Time
	}
	return acquired, expiresAt, rows.Err()
}

// read reads the entry key back after an upsert that did not lock it.
func (in *Inbox) read(ctx context.Context, key inbox.Key) (found bool, processedAt, expiresAt dbTime, relockable bool, err error) {
	rows, err := querySQL(ctx, in.s.db, in.readSQL, key.MessageID, key.ConsumerType)
	if err != nil {
		return false, dbTime{}, dbTime{}, false, err
	}
	defer rows.Close()
	if rows.Next() {
		var token *string
		var rel int
		if err := rows.Scan(&processedAt, &expiresAt, &token, &rel); err != nil {
			return false, dbTime{}, dbTime{}, false, err
		}
		found, relockable = true, rel == 1
	}
	return found, processedAt, expiresAt, relockable, rows.Err()
}

// Process implements inbox.Store. fn receives a ctx carrying the transaction
// (see TxFromContext); the entry is marked processed in the same
// transaction, guarded by token. A panic in fn rolls back and propagates.
//
// With SQLite opened by OpenSQLite the transaction holds the only
// connection: fn must use the transaction from its ctx for all database
// work.
func (in *Inbox) Process(ctx context.Context, key inbox.Key, token string, fn func(ctx context.Context) error) error {
	// gorm's Transaction rolls back when fn fails or panics (and re-panics),
	// and returns fn's error as is.
	return in.s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := fn(WithTx(ctx, tx)); err != nil {
			return err
		}
		res, err := execSQL(ctx, tx, in.markSQL, key.MessageID, key.ConsumerType, token)
		if err != nil {
			return fmt.Errorf("gormstore: inbox mark %s/%s processed: %w", key.MessageID, key.ConsumerType, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("gormstore: inbox mark %s/%s processed: %w", key.MessageID, key.ConsumerType, err)
		}
		if n == 0 {
			return inbox.ErrLockLost
		}
		return nil
	})
}

// ProcessAndLock implements inbox.Store. It reports true only when fn ran
// and the transaction committed; when fn fails it returns false and fn's
// error. Besides a new entry it also takes over an unprocessed entry whose
// lock was released or expired (left by Process-style handling), since that
// is neither a duplicate nor a live delivery.
func (in *Inbox) ProcessAndLock(ctx context.Context, key inbox.Key, fn func(ctx context.Context) error) (bool, error) {
	var claimed bool
	err := in.s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res, err := execSQL(ctx, tx, in.processAndLockSQL, key.MessageID, key.ConsumerType)
		if err != nil {
			return fmt.Errorf("gormstore: inbox insert %s/%s: %w", key.MessageID, key.ConsumerType, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("gormstore: inbox insert %s/%s: %w", key.MessageID, key.ConsumerType, err)
		} else if n == 0 {
			return errDuplicate
		}
		claimed = true
		return fn(WithTx(ctx, tx))
	})
	switch {
	case errors.Is(err, errDuplicate):
		return false, nil
	case err != nil:
		return false, err
	}
	return claimed, nil
}

// errDuplicate makes Transaction roll back a ProcessAndLock that found the
// entry; it never leaves the package.
var errDuplicate = errors.New("gormstore: duplicate inbox entry")

// Release implements inbox.Store. Releasing with a token that no longer
// holds the lock (taken over, or already processed) does nothing.
func (in *Inbox) Release(ctx context.Context, key inbox.Key, token string) error {
	res, err := execSQL(ctx, in.s.db, in.releaseSQL, key.MessageID, key.ConsumerType, token)
	if err != nil {
		return fmt.Errorf("gormstore: inbox release %s/%s: %w", key.MessageID, key.ConsumerType, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return inbox.ErrLockLost
	}
	return nil
}

// ForceRelease drops the lock of the unprocessed entry key whatever its
// token, so that the next delivery can take it at once: the operator's way
// out of a lock left by a delivery that will never finish. It reports
// whether a locked, unprocessed entry was found. The holder, should it be
// still running, can no longer commit: its processed mark is guarded by its
// token. Not part of inbox.Store (Release needs the holder's token).
func (in *Inbox) ForceRelease(ctx context.Context, key inbox.Key) (bool, error) {
	res := in.s.db.WithContext(ctx).Exec(in.forceReleaseSQL, key.MessageID, key.ConsumerType)
	if res.Error != nil {
		return false, fmt.Errorf("gormstore: inbox force release %s/%s: %w", key.MessageID, key.ConsumerType, res.Error)
	}
	return res.RowsAffected > 0, nil
}

// Cleanup implements inbox.Store.
func (in *Inbox) Cleanup(ctx context.Context, retention time.Duration, batch int) (int, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("gormstore: inbox cleanup batch must be positive, got %d", batch)
	}
	cutoff := in.s.dialect.shift(-retention)
	res := in.s.db.WithContext(ctx).Exec(in.cleanupSQL, cutoff, cutoff, batch)
	if res.Error != nil {
		return 0, fmt.Errorf("gormstore: inbox cleanup: %w", res.Error)
	}
	return int(res.RowsAffected), nil
}

// List implements inbox.Store: newest received first.
func (in *Inbox) List(ctx context.Context, q inbox.Query) ([]inbox.Entry, error) {
	var where []string
	var args []any
	if q.MessageID != "" {
		where = append(where, "message_id = ?")
		args = append(args, q.MessageID)
	}
	if q.ConsumerType != "" {
		where = append(where, "consumer_type = ?")
		args = append(args, q.ConsumerType)
	}
	if q.Processed != nil {
		if *q.Processed {
			where = append(where, "processed_at IS NOT NULL")
		} else {
			where = append(where, "processed_at IS NULL")
		}
	}
	sql := in.listSQL
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	// The key breaks ties between equal receive times so that pages neither
	// repeat nor skip entries.
	sql += " ORDER BY received_at DESC, message_id DESC, consumer_type DESC LIMIT ? OFFSET ?"
	args = append(args, limit, max(q.Offset, 0))

	var rows []inboxRow
	if err := in.s.db.WithContext(ctx).Raw(sql, args...).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("gormstore: inbox list: %w", err)
	}
	entries := make([]inbox.Entry, len(rows))
	for i, r := range rows {
		entries[i] = r.entry()
	}
	return entries, nil
}

// Stats implements inbox.Store. Released entries count as expired: both
// wait for a redelivery.
func (in *Inbox) Stats(ctx context.Context) (inbox.Stats, error) {
	var st struct {
		Locked  int64 `gorm:"column:locked"`
		Expired int64 `gorm:"column:expired"`
	}
	if err := in.s.db.WithContext(ctx).Raw(in.statsSQL).Scan(&st).Error; err != nil {
		return inbox.Stats{}, fmt.Errorf("gormstore: inbox stats: %w", err)
	}
	return inbox.Stats{Locked: st.Locked, Expired: st.Expired}, nil
}
