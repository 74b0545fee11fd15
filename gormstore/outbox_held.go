package gormstore

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/barewire-go/barewire/internal/detach"
	"github.com/barewire-go/barewire/outbox"
)

var _ outbox.BatchClaimer = (*Outbox)(nil)

// RelayPipeliner is implemented by a PipelinePlugin plugin that can also
// send a relay claim's BEGIN with its query (postgresdb.Pipeline does):
// Outbox.ClaimBatch then costs one round trip to claim and one to settle.
type RelayPipeliner interface {
	CommitPipeliner
	// BeginQuery runs BEGIN and then query with args in the transaction
	// BEGIN opened, on the driver connection dc, sending both in one
	// write, and scans each row query returns into the destinations dest
	// returns. When it fails, the connection may be in the transaction or
	// not.
	BeginQuery(ctx context.Context, dc any, query string, args []any, dest func() []any) error
}

// ClaimBatch implements outbox.BatchClaimer. On PostgreSQL the claimed rows
// are locked (FOR UPDATE SKIP LOCKED) in a transaction that stays open
// until Settle commits it: claiming writes nothing (no lease), another
// relay skips the rows while they are held, and a relay that dies gives
// them back with its connection. hold becomes the transaction's
// idle_in_transaction_session_timeout, so a relay that froze mid-batch
// (a paused process, a cut network) loses its connection and its rows
// after hold, as an expired lease would. The transaction runs on a
// connection of the *sql.DB under the store's pool; with the
// PipelinePlugin plugin registered (postgresdb.Open does) the BEGIN goes
// with the claim and the outcome with the COMMIT, two round trips a batch.
// A batch is leased as by outbox.ClaimLeased instead on SQLite, which has
// one writer at a time, and when the store's *gorm.DB has no *sql.DB
// under it (a transaction, a custom pool).
func (o *Outbox) ClaimBatch(ctx context.Context, owner string, limit int, hold time.Duration) (outbox.Batch, error) {
	if o.s.dialect.name != DialectPostgres {
		return outbox.ClaimLeased(ctx, o, owner, limit, hold)
	}
	if err := checkClaim(owner, limit, "hold", hold); err != nil {
		return nil, err
	}
	c, pipe, err := o.heldConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("gormstore: outbox claim: %w", err)
	}
	if c == nil {
		return outbox.ClaimLeased(ctx, o, owner, limit, hold)
	}
	b := &heldBatch{o: o, c: c, pipe: pipe}
	rows, err := b.claim(ctx, limit, hold)
	if err != nil {
		discard(c)
		return nil, fmt.Errorf("gormstore: outbox claim: %w", err)
	}
	if b.msgs, err = toMessages(rows, true); err != nil || len(b.msgs) == 0 {
		rctx, cancel := detach.From(ctx)
		_, rerr := c.ExecContext(rctx, "ROLLBACK")
		cancel()
		if rerr != nil {
			discard(c)
		} else {
			_ = c.Close()
		}
		if err != nil {
			return nil, err
		}
		return &heldBatch{}, nil
	}
	return b, nil
}

// heldConn takes a connection for a held batch, and the plugin that can
// pipeline its statements (nil when none is registered). A nil connection
// and nil error mean the store's pool has no *sql.DB under it.
func (o *Outbox) heldConn(ctx context.Context) (*sql.Conn, RelayPipeliner, error) {
	c, p, _, err := pipelineConn(ctx, o.s.db)
	if err != nil {
		return nil, nil, err
	}
	if c != nil {
		if rp, ok := p.(RelayPipeliner); ok {
			return c, rp, nil
		}
		return c, nil, nil
	}
	if _, inTx := conn(o.s.db).(interface{ Commit() error }); inTx {
		return nil, nil, nil
	}
	sqlDB, err := o.s.db.DB()
	if err != nil || sqlDB == nil {
		return nil, nil, nil
	}
	c, err = sqlDB.Conn(ctx)
	return c, nil, err
}

// heldBatch is a batch whose rows are locked by the transaction open on c.
// Its zero value is an empty batch.
type heldBatch struct {
	o    *Outbox
	c    *sql.Conn
	pipe RelayPipeliner
	msgs []*outbox.Message
}

func (b *heldBatch) Messages() []*outbox.Message { return b.msgs }

// claim begins the transaction and claims up to limit rows in it.
func (b *heldBatch) claim(ctx context.Context, limit int, hold time.Duration) ([]outboxRow, error) {
	ms := max(min(hold.Milliseconds(), math.MaxInt32), 1)
	args := []any{strconv.FormatInt(ms, 10), limit}
	var rows []outboxRow
	dest := func() []any {
		rows = append(rows, outboxRow{})
		return rows[len(rows)-1].dests()
	}
	if b.pipe != nil {
		err := b.c.Raw(func(dc any) error {
			return b.pipe.BeginQuery(ctx, dc, b.o.claimHeldSQL, args, dest)
		})
		return rows, err
	}
	if _, err := b.c.ExecContext(ctx, "BEGIN"); err != nil {
		return nil, err
	}
	r, err := b.c.QueryContext(ctx, b.o.claimHeldSQL, args...)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	for r.Next() {
		if err := r.Scan(dest()...); err != nil {
			return nil, err
		}
	}
	return rows, r.Err()
}

// Settle writes s in the batch's transaction and commits it; rows s does
// not name were never written and are released by the commit. On any
// failure the connection is closed, which rolls the transaction back.
func (b *heldBatch) Settle(ctx context.Context, s outbox.Settlement) error {
	if b.c == nil {
		return nil
	}
	c := b.c
	b.c = nil
	if err := b.settle(ctx, c, b.statements(s)); err != nil {
		discard(c)
		return fmt.Errorf("gormstore: outbox settle: %w", err)
	}
	return c.Close()
}

func (b *heldBatch) statements(s outbox.Settlement) []Statement {
	o := b.o
	var stmts []Statement
	if len(s.Delivered) > 0 {
		q := o.markHeldSQL
		if s.Delete {
			q = o.deleteHeldSQL
		}
		stmts = append(stmts, Statement{SQL: q, Args: []any{s.Delivered}})
	}
	for _, f := range s.Failed {
		stmts = append(stmts, Statement{SQL: o.failHeldSQL, Args: []any{
			sanitizeError(f.Error), max(f.RetryAfter, 0).Seconds(), f.MaxAttempts, f.ID}})
	}
	if len(s.Later) > 0 {
		stmts = append(stmts, Statement{SQL: o.laterHeldSQL, Args: []any{max(s.LaterAfter, 0).Seconds(), s.Later}})
	}
	return stmts
}

func (b *heldBatch) settle(ctx context.Context, c *sql.Conn, stmts []Statement) error {
	if b.pipe != nil {
		return c.Raw(func(dc any) error { return b.pipe.CommitStatements(ctx, dc, stmts) })
	}
	for _, st := range stmts {
		if _, err := c.ExecContext(ctx, st.SQL, st.Args...); err != nil {
			return err
		}
	}
	_, err := c.ExecContext(ctx, "COMMIT")
	return err
}
