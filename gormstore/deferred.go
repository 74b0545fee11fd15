package gormstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/outbox"
)

// PipelinePlugin is the name of the GORM plugin (see CommitPipeliner) that
// lets Outbox.Begin send a transaction's outbox insert and its COMMIT in
// one round trip. postgresdb.Pipeline is one; postgresdb.Open registers it.
const PipelinePlugin = "barewire:commit-pipeline"

// CommitPipeliner is implemented by the GORM plugin registered as
// PipelinePlugin. It is an interface of its own so that gormstore, which
// services on the embedded SQLite default import, does not link a
// PostgreSQL driver.
type CommitPipeliner interface {
	// Supports reports whether dc, a driver connection of database/sql's
	// pool, is one CommitWith can drive.
	Supports(dc any) bool
	// CommitWith runs query with args on the driver connection dc (inside
	// the transaction begun on it), scans each row the query returns into
	// the destinations dest returns, and commits, sending the statement
	// and the COMMIT in one write. When query fails the COMMIT must not
	// run (PostgreSQL skips what follows a failed statement up to the next
	// Sync). query "" sends the COMMIT alone. A COMMIT that rolled back
	// (the transaction had failed) is an error.
	CommitWith(ctx context.Context, dc any, query string, args []any, dest func() []any) error
}

// DeferredTx is a transaction begun by Outbox.Begin, the *gorm.DB's
// ConnPool inside it. Outbox.Add in it validates the messages at once and
// keeps them; Commit inserts them in one multi-row statement sent together
// with the COMMIT. Once a SAVEPOINT has run in it, Add inserts at once as
// elsewhere (a later ROLLBACK TO must take the row with it), after writing
// what it kept so far.
//
// A DeferredTx is used by one goroutine at a time, like any transaction.
type DeferredTx struct {
	o    *Outbox
	db   *sql.DB
	conn *sql.Conn
	pipe CommitPipeliner

	mu        sync.Mutex
	pending   []*outbox.Message
	immediate bool // a savepoint was taken
	done      bool
	failed    error // writing the kept rows before a savepoint failed

	// first are statements sent in the commit's write ahead of the kept
	// rows (the inbox's processed mark); they need an InboxPipeliner.
	first []Statement
	// after run once the COMMIT has succeeded (AfterCommit).
	after []func()
}

// AfterCommit registers f to run once the transaction has committed, after
// the COMMIT's round trip returned; f does not run when the transaction
// rolls back or its commit fails. For code that must not act before the
// transaction's effects are visible (a metric, a notification); a
// transaction opened through GORM's own Begin has no DeferredTx (see
// DeferredOf) and its caller's commit is the place for that.
func (d *DeferredTx) AfterCommit(f func()) {
	d.mu.Lock()
	d.after = append(d.after, f)
	d.mu.Unlock()
}

// InboxPipeliner is implemented by a PipelinePlugin plugin that can also
// drive the inbox's round trips (postgresdb.Pipeline does): Inbox.LockAndProcess
// takes the lock and begins the transaction in one write, and sends the
// processed mark, the consumer's outbox rows and the COMMIT in another.
type InboxPipeliner interface {
	CommitPipeliner
	// RunThenBegin runs query with args in a transaction of its own
	// (committed when the query ends), scans each row it returns into the
	// destinations dest returns, then runs BEGIN: both in one write. When
	// it returns nil the connection is in the transaction BEGIN opened;
	// when it returns an error, the connection may be in it or not.
	RunThenBegin(ctx context.Context, dc any, query string, args []any, dest func() []any) error
	// CommitStatements runs stmts in order in the transaction begun on dc,
	// then COMMIT, in one write. A statement that fails makes PostgreSQL
	// skip the rest and the COMMIT. A COMMIT that rolled back is an error.
	CommitStatements(ctx context.Context, dc any, stmts []Statement) error
}

// Statement is one statement of InboxPipeliner.CommitStatements.
type Statement struct {
	SQL  string
	Args []any
	// Dest returns the destinations of one row's columns; nil: the rows
	// are not read.
	Dest func() []any
}

// Begin begins a transaction whose outbox rows are written at commit, in
// the same round trip as the COMMIT. It returns a nil *gorm.DB when db
// cannot do that: not on PostgreSQL, no CommitPipeliner plugin registered
// on db, or no *sql.DB under db's pool. The transaction runs on a
// connection of the *sql.DB under db's pool: a custom gorm.ConnPool's
// BeginTx is not called for it (registering the plugin opts in to that).
// The caller ends it with tx.Commit or tx.Rollback.
func (o *Outbox) Begin(ctx context.Context, db *gorm.DB) (*gorm.DB, error) {
	if o.s.dialect.name != DialectPostgres {
		return nil, nil
	}
	c, p, sqlDB, err := pipelineConn(ctx, db)
	if c == nil {
		return nil, err
	}
	if _, err := c.ExecContext(ctx, "BEGIN"); err != nil {
		discard(c)
		return nil, err
	}
	d := &DeferredTx{o: o, db: sqlDB, conn: c, pipe: p}
	return d.session(ctx, db), nil
}

// pipelineConn takes a connection of the *sql.DB under db's pool for a
// transaction driven through db's PipelinePlugin plugin. It returns a nil
// *sql.Conn (and a nil error) when db has no such plugin, is in a
// transaction already, has no *sql.DB under it, or when the plugin cannot
// drive the connection; an error when taking a connection failed.
func pipelineConn(ctx context.Context, db *gorm.DB) (*sql.Conn, CommitPipeliner, *sql.DB, error) {
	if db == nil || db.Config == nil {
		return nil, nil, nil, nil
	}
	p, ok := db.Config.Plugins[PipelinePlugin].(CommitPipeliner)
	if !ok {
		return nil, nil, nil, nil
	}
	if _, inTx := conn(db).(gorm.TxCommitter); inTx {
		return nil, nil, nil, nil
	}
	sqlDB, err := db.DB()
	if err != nil || sqlDB == nil {
		return nil, nil, nil, nil
	}
	c, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	supported := false
	_ = c.Raw(func(dc any) error {
		supported = p.Supports(dc)
		return nil
	})
	if !supported {
		_ = c.Close()
		return nil, nil, nil, nil
	}
	return c, p, sqlDB, nil
}

// session is a *gorm.DB of db's configuration whose statements run in d.
func (d *DeferredTx) session(ctx context.Context, db *gorm.DB) *gorm.DB {
	tx := db.Session(&gorm.Session{Context: ctx, NewDB: true})
	tx.Statement.ConnPool = d
	return tx
}

// DeferredOf returns the DeferredTx that tx runs in, or nil.
func DeferredOf(tx *gorm.DB) *DeferredTx {
	if tx == nil || tx.Statement == nil {
		return nil
	}
	d, _ := tx.Statement.ConnPool.(*DeferredTx)
	return d
}

// discard closes c and keeps it out of the pool: its session state is not
// known.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.Close()
}

// keep holds msgs for the commit; false when they must be inserted now.
func (d *DeferredTx) keep(o *Outbox, msgs []*outbox.Message) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.o != o || d.immediate || d.done {
		return false
	}
	d.pending = append(d.pending, msgs...)
	return true
}

// Pending is how many messages the transaction holds for its commit.
func (d *DeferredTx) Pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pending)
}

// take returns the pending messages and forgets them.
func (d *DeferredTx) take() []*outbox.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pending
	d.pending = nil
	return p
}

// isSavepoint reports whether q takes a savepoint.
func isSavepoint(q string) bool {
	q = strings.TrimLeft(q, " \t\r\n")
	return len(q) >= 9 && strings.EqualFold(q[:9], "SAVEPOINT")
}

// beforeStatement writes the pending rows before a SAVEPOINT and makes
// later Adds immediate: a ROLLBACK TO that savepoint then removes exactly
// the rows added after it, as without deferral.
func (d *DeferredTx) beforeStatement(ctx context.Context, q string) error {
	if !isSavepoint(q) {
		return nil
	}
	d.mu.Lock()
	d.immediate = true
	d.mu.Unlock()
	return d.writeKept(ctx)
}

// writeKept inserts the rows kept so far, now: before a statement that
// must see them (a savepoint, the store's Cancel in this transaction).
func (d *DeferredTx) writeKept(ctx context.Context) error {
	err := d.flush(ctx, d.take())
	if err != nil {
		// The rows are not in the transaction (a context canceled before
		// the insert was sent leaves the transaction itself intact): it
		// must not commit.
		d.mu.Lock()
		d.failed = err
		d.mu.Unlock()
	}
	return err
}

// flush inserts msgs now, in the transaction.
func (d *DeferredTx) flush(ctx context.Context, msgs []*outbox.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return d.o.insertAll(ctx, d, msgs)
}

// ExecContext implements gorm.ConnPool.
func (d *DeferredTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if err := d.beforeStatement(ctx, q); err != nil {
		return nil, err
	}
	return d.conn.ExecContext(ctx, q, args...)
}

// QueryContext implements gorm.ConnPool.
func (d *DeferredTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if err := d.beforeStatement(ctx, q); err != nil {
		return nil, err
	}
	return d.conn.QueryContext(ctx, q, args...)
}

// QueryRowContext implements gorm.ConnPool.
func (d *DeferredTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	// A failed insert before a savepoint aborts the transaction on the
	// server: this statement and the COMMIT fail with it.
	_ = d.beforeStatement(ctx, q)
	return d.conn.QueryRowContext(ctx, q, args...)
}

// PrepareContext implements gorm.ConnPool.
func (d *DeferredTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return d.conn.PrepareContext(ctx, q)
}

// GetDBConn implements gorm.GetDBConnector: tx.DB() is the pool's *sql.DB.
func (d *DeferredTx) GetDBConn() (*sql.DB, error) { return d.db, nil }

// Commit implements gorm.TxCommitter: the pending outbox rows and the
// COMMIT in one round trip. When the insert fails, nothing commits and
// the transaction is rolled back.
func (d *DeferredTx) Commit() error { return d.CommitContext(context.Background()) }

// ErrTxDone is returned by Commit and Rollback on a DeferredTx that has
// already ended.
var ErrTxDone = errors.New("gormstore: transaction has already been committed or rolled back")

// CommitContext is Commit with a context for its statements.
func (d *DeferredTx) CommitContext(ctx context.Context) (err error) {
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		return ErrTxDone
	}
	d.done = true
	msgs, failed := d.pending, d.failed
	d.pending = nil
	d.mu.Unlock()
	defer func() {
		if err != nil {
			_ = d.end(ctx)
			return
		}
		_ = d.conn.Close()
	}()
	if failed != nil {
		return fmt.Errorf("gormstore: outbox add before a savepoint failed, not committing: %w", failed)
	}
	stmts := d.first
	var inserted func()
	if len(msgs) > 0 {
		parts := chunk(msgs, maxInsertRows)
		for _, part := range parts[:len(parts)-1] {
			if err := d.o.insertAll(ctx, d, part); err != nil {
				return err
			}
		}
		st, done, err := d.o.commitInsert(parts[len(parts)-1])
		if err != nil {
			return err
		}
		stmts, inserted = append(stmts, st), done
	}
	switch {
	case len(stmts) == 0:
		err = d.commitWith(ctx, "", nil, nil)
	case len(d.first) == 0:
		if err = d.commitWith(ctx, stmts[0].SQL, stmts[0].Args, stmts[0].Dest); err != nil {
			err = fmt.Errorf("gormstore: outbox add at commit: %w", err)
		}
	default:
		err = d.conn.Raw(func(dc any) error {
			return d.pipe.(InboxPipeliner).CommitStatements(ctx, dc, stmts)
		})
	}
	if err != nil {
		return err
	}
	if inserted != nil {
		inserted()
	}
	d.mu.Lock()
	after := d.after
	d.after = nil
	d.mu.Unlock()
	for _, f := range after {
		f()
	}
	return nil
}

// Rollback implements gorm.TxCommitter.
func (d *DeferredTx) Rollback() error {
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		return ErrTxDone
	}
	d.done = true
	d.pending = nil
	d.mu.Unlock()
	return d.end(context.Background())
}

// end rolls back (harmless when the failed COMMIT already did) and gives
// the connection back, or drops it when the ROLLBACK failed too.
func (d *DeferredTx) end(ctx context.Context) error {
	if _, err := d.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
		discard(d.conn)
		return err
	}
	return d.conn.Close()
}

// insertAll inserts msgs in the transaction now, in chunks.
func (o *Outbox) insertAll(ctx context.Context, d *DeferredTx, msgs []*outbox.Message) error {
	watch := o.watch != nil
	for _, part := range chunk(msgs, maxInsertRows) {
		xid, err := o.insert(ctx, d, part, watch)
		if err != nil {
			return err
		}
		if watch {
			o.watch.add(xid)
		}
		watch = false
	}
	return nil
}

// commitInsert is the INSERT of msgs sent with the COMMIT, and what to do
// once it committed: hand the transaction to the commit watcher and set
// the messages' ids.
func (o *Outbox) commitInsert(msgs []*outbox.Message) (Statement, func(), error) {
	watch := o.watch != nil
	args, err := o.insertArgs(msgs)
	if err != nil {
		return Statement{}, nil, err
	}
	rows := make([]insertedRow, 0, len(msgs))
	st := Statement{SQL: o.insertSQL(len(msgs), watch), Args: args, Dest: func() []any {
		rows = append(rows, insertedRow{})
		r := &rows[len(rows)-1]
		if watch {
			return []any{&r.ID, &r.CreatedAt, &r.Xid}
		}
		return []any{&r.ID, &r.CreatedAt}
	}}
	done := func() {
		if watch && len(rows) > 0 {
			o.watch.add(rows[0].Xid)
		}
		// Committed: a read-back that does not pair up leaves the ids
		// unset but the rows are in.
		_ = o.assign(msgs, rows)
	}
	return st, done, nil
}

// commitWith runs the plugin's CommitWith on the transaction's connection.
func (d *DeferredTx) commitWith(ctx context.Context, query string, args []any, dest func() []any) error {
	return d.conn.Raw(func(dc any) error {
		return d.pipe.CommitWith(ctx, dc, query, args, dest)
	})
}
