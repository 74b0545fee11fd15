package gormstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/internal/detach"
	"github.com/barewire-go/barewire/outbox"
)

// PipelinePlugin is the name of the GORM plugin (see CommitPipeliner) that
// lets Outbox.Begin send a transaction's BEGIN with its first Exec and its
// outbox insert with its COMMIT. postgresdb.Pipeline is one;
// postgresdb.Open registers it.
const PipelinePlugin = "barewire:commit-pipeline"

// CommitPipeliner is implemented by the GORM plugin registered as
// PipelinePlugin. It is an interface of its own so that gormstore, which
// services on the embedded SQLite default import, does not link a
// PostgreSQL driver.
type CommitPipeliner interface {
	// Supports reports whether dc, a driver connection of database/sql's
	// pool, is one the plugin can drive.
	Supports(dc any) bool
	// BeginExec runs BEGIN and then query with args (as database/sql's
	// ExecContext would) in the transaction BEGIN opened, on the driver
	// connection dc, sending both in one write. It returns the rows query
	// affected. When it fails, the connection may be in the transaction
	// or not.
	BeginExec(ctx context.Context, dc any, query string, args []any) (int64, error)
	// CommitStatements runs stmts in order in the transaction on dc, then
	// COMMIT, in one write, scanning each row a statement with a Dest
	// returns. A statement that fails makes PostgreSQL skip the rest and
	// the COMMIT. A COMMIT that rolled back (the transaction had failed)
	// is an error.
	CommitStatements(ctx context.Context, dc any, stmts []Statement) error
}

// DeferredTx is a transaction begun by Outbox.Begin, the *gorm.DB's
// ConnPool inside it. Its BEGIN is not sent until its first statement: an
// Exec carries it in the same write, anything else (a query, a prepare)
// sends it first, and a transaction that runs no statement before its
// commit sends BEGIN with the COMMIT (or nothing at all). Outbox.Add in it
// validates the messages at once and keeps them; Commit inserts them in
// one multi-row statement sent together with the COMMIT. Once a SAVEPOINT
// has run in it, Add inserts at once as elsewhere (a later ROLLBACK TO must
// take the row with it), after writing what it kept so far.
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
	// unbegun: BEGIN has not been sent yet (Outbox.Begin's transactions
	// until their first statement).
	unbegun bool
	// broken: sending the BEGIN failed, so the connection may not be in a
	// transaction: every later statement fails with it rather than run
	// outside one.
	broken error

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
// processed mark, the consumer's outbox rows and the COMMIT in another
// (CommitStatements).
type InboxPipeliner interface {
	CommitPipeliner
	// RunThenBegin runs query with args in a transaction of its own
	// (committed when the query ends), scans each row it returns into the
	// destinations dest returns, then runs BEGIN: both in one write. When
	// it returns nil the connection is in the transaction BEGIN opened;
	// when it returns an error, the connection may be in it or not.
	RunThenBegin(ctx context.Context, dc any, query string, args []any, dest func() []any) error
}

// Statement is one statement of CommitPipeliner.CommitStatements.
type Statement struct {
	SQL  string
	Args []any
	// Dest returns the destinations of one row's columns; nil: the rows
	// are not read.
	Dest func() []any
}

// Begin begins a transaction whose BEGIN is sent with its first Exec (or
// before its first query) and whose outbox rows are written at commit, in
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
	d := &DeferredTx{o: o, db: sqlDB, conn: c, pipe: p, unbegun: true}
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

// ExecContext implements gorm.ConnPool. The transaction's first statement,
// when it is an Exec, carries the BEGIN in its write.
func (d *DeferredTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if err := d.beforeStatement(ctx, q); err != nil {
		return nil, err
	}
	begin, err := d.takeBegin()
	if err != nil {
		return nil, err
	}
	if !begin {
		return d.conn.ExecContext(ctx, q, args...)
	}
	var n int64
	err = d.conn.Raw(func(dc any) error {
		var err error
		n, err = d.pipe.BeginExec(ctx, dc, q, driverArgs(args))
		return err
	})
	if err != nil {
		// Whatever failed, nothing after it may run: the statement's own
		// error aborted the transaction, and an error before the server
		// ran the BEGIN would leave later statements outside one.
		d.breakTx(err)
		return nil, err
	}
	return driver.RowsAffected(n), nil
}

// QueryContext implements gorm.ConnPool.
func (d *DeferredTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if err := d.beforeStatement(ctx, q); err != nil {
		return nil, err
	}
	if err := d.ensureBegun(ctx); err != nil {
		return nil, err
	}
	return d.conn.QueryContext(ctx, q, args...)
}

// QueryRowContext implements gorm.ConnPool.
func (d *DeferredTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	// A failed insert before a savepoint aborts the transaction on the
	// server: this statement and the COMMIT fail with it.
	_ = d.beforeStatement(ctx, q)
	if err := d.ensureBegun(ctx); err != nil {
		return d.conn.QueryRowContext(failedContext(ctx, err), q, args...)
	}
	return d.conn.QueryRowContext(ctx, q, args...)
}

// PrepareContext implements gorm.ConnPool.
func (d *DeferredTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	if err := d.ensureBegun(ctx); err != nil {
		return nil, err
	}
	return d.conn.PrepareContext(ctx, q)
}

// takeBegin reports whether the next statement must send the BEGIN (and
// from now on it counts as sent), or the error that broke the transaction.
func (d *DeferredTx) takeBegin() (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.broken != nil {
		return false, d.broken
	}
	begin := d.unbegun
	d.unbegun = false
	return begin, nil
}

// ensureBegun sends the BEGIN on its own when it has not been sent: before
// a query or a prepare, which cannot carry it.
func (d *DeferredTx) ensureBegun(ctx context.Context) error {
	begin, err := d.takeBegin()
	if err != nil || !begin {
		return err
	}
	if _, err := d.conn.ExecContext(ctx, "BEGIN"); err != nil {
		err = fmt.Errorf("gormstore: begin: %w", err)
		d.breakTx(err)
		return err
	}
	return nil
}

// breakTx makes every later statement and the commit fail with err.
func (d *DeferredTx) breakTx(err error) {
	d.mu.Lock()
	if d.broken == nil {
		d.broken = err
	}
	d.mu.Unlock()
}

// failedContext is a canceled context, for a *sql.Row that must fail
// without running its query (database/sql offers no other way to make
// one): the driver refuses a done context before sending anything.
func failedContext(ctx context.Context, err error) context.Context {
	c, cancel := context.WithCancelCause(ctx)
	cancel(err)
	return c
}

// driverArgs are args as database/sql hands them to pgx's driver: named
// arguments unwrapped (pgx takes every other value as it is).
func driverArgs(args []any) []any {
	cloned := false
	for i, a := range args {
		if na, ok := a.(sql.NamedArg); ok {
			if !cloned {
				args, cloned = slices.Clone(args), true
			}
			args[i] = na.Value
		}
	}
	return args
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
	msgs, failed, broken := d.pending, d.failed, d.broken
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
	if broken != nil {
		return fmt.Errorf("gormstore: the transaction failed, not committing: %w", broken)
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
	begin, err := d.takeBegin()
	if err != nil {
		return err
	}
	switch {
	case begin && len(stmts) == 0:
		// No statement ran and no row is to be written: nothing to send.
	case begin:
		// No statement ran: the BEGIN goes with the rows and the COMMIT.
		stmts = append([]Statement{{SQL: "BEGIN"}}, stmts...)
		fallthrough
	case inserted != nil && len(d.first) == 0:
		if err = d.commitStatements(ctx, stmts); err != nil {
			err = fmt.Errorf("gormstore: outbox add at commit: %w", err)
		}
	default:
		err = d.commitStatements(ctx, stmts)
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
// the connection back, or drops it when the ROLLBACK failed too. A
// transaction that never sent its BEGIN has nothing to roll back.
func (d *DeferredTx) end(ctx context.Context) error {
	d.mu.Lock()
	unbegun := d.unbegun
	d.mu.Unlock()
	if unbegun {
		return d.conn.Close()
	}
	rctx, cancel := detach.From(ctx)
	defer cancel()
	if _, err := d.conn.ExecContext(rctx, "ROLLBACK"); err != nil {
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

// commitStatements runs the plugin's CommitStatements on the transaction's
// connection.
func (d *DeferredTx) commitStatements(ctx context.Context, stmts []Statement) error {
	return d.conn.Raw(func(dc any) error {
		return d.pipe.CommitStatements(ctx, dc, stmts)
	})
}
