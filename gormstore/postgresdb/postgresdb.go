// Package postgresdb opens a PostgreSQL database for the bus: GORM with
// gorm.io/driver/postgres (pgx), its logger silent and its pool bounded.
// It is a package of its own so that services on the embedded SQLite
// default, which import gormstore, do not link pgx.
//
// Any *gorm.DB opened with gorm.io/driver/postgres's default pgx driver
// works with the bus; this is a convenience with sensible pool settings.
package postgresdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/barewire-go/barewire/gormstore"
)

// Open opens a PostgreSQL database from a DSN such as
// "host=127.0.0.1 user=app dbname=app sslmode=disable" or a postgres://
// URL, with GORM's logger silent and a pool of at most 20 connections (the
// outbox's Listen holds one for as long as it runs), and the Pipeline plugin
// registered. A statement whose context ends is canceled on the server (a
// cancel request) rather than by closing its connection, so the transaction
// it ran in survives. It pings the server.
func Open(dsn string) (*gorm.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgresdb: open: %w", err)
	}
	// A statement whose context ends is canceled on the server (a cancel
	// request), not by closing the connection, pgx's default: the
	// transaction survives it (aborted, so a ROLLBACK TO SAVEPOINT works),
	// and in a group-commit batch one consumer's timeout inside SQL costs
	// its neighbours nothing. A server that does not answer the cancel
	// within cancelGrace has the connection closed, as before.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: stdlib.OpenDB(*cfg)}), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		closeQuietly(db)
		return nil, fmt.Errorf("postgresdb: open: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("postgresdb: open: %w", err)
	}
	sqlDB.SetMaxOpenConns(20)
	sqlDB.SetMaxIdleConns(10)
	// Recycling connections now and then lets the pool follow failovers and
	// server-side settings changes.
	sqlDB.SetConnMaxLifetime(30 * time.Minute)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.Use(Pipeline()); err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("postgresdb: open: %w", err)
	}
	return db, nil
}

// cancelGrace is how long a canceled statement's connection waits for the
// server to answer the cancel request before it is closed.
const cancelGrace = 2 * time.Second

// closeQuietly closes the pool of a database whose opening failed after the
// pool was created (gorm.Open pings after opening), so that its goroutines
// do not leak.
func closeQuietly(db *gorm.DB) {
	if db == nil || db.Config == nil || db.ConnPool == nil {
		return
	}
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// Pipeline is the GORM plugin that lets bus.Transaction save round trips:
// the transaction's BEGIN travels with its first Exec (a statement run
// through tx.Exec, or GORM's Update, Delete or a Create that reads nothing
// back), and its outbox rows with its COMMIT (see gormstore.Outbox.Begin).
// A transaction whose first statement is an Exec then costs one round trip
// per statement, the COMMIT riding on the last write, however many messages
// it publishes; one whose first statement reads (a Query, a Create that
// returns a generated key) costs one more, for the BEGIN. Open registers
// it; register it on a *gorm.DB opened otherwise with
// db.Use(postgresdb.Pipeline()). With it, bus.Transaction begins its
// transactions on a connection of the *sql.DB under the database's pool,
// not through a custom gorm.ConnPool's BeginTx.
func Pipeline() gorm.Plugin { return pipeline{} }

type pipeline struct{}

var (
	_ gormstore.CommitPipeliner = pipeline{}
	_ gormstore.InboxPipeliner  = pipeline{}
	_ gormstore.RelayPipeliner  = pipeline{}
)

func (pipeline) Name() string                 { return gormstore.PipelinePlugin }
func (pipeline) Initialize(db *gorm.DB) error { return nil }

// pgxConn is what pgx's database/sql driver connection offers.
type pgxConn interface{ Conn() *pgx.Conn }

func (pipeline) Supports(dc any) bool {
	_, ok := dc.(pgxConn)
	return ok
}

// BeginExec sends BEGIN and query in one write. With arguments they go as
// one pgx batch (one Sync: the BEGIN opens a transaction block that the
// Sync leaves open); without, as one simple-protocol query "BEGIN; query",
// which is how pgx runs an argument-less statement on its own (and which
// allows query to hold several statements, as it does there).
func (pipeline) BeginExec(ctx context.Context, dc any, query string, args []any) (int64, error) {
	c, ok := dc.(pgxConn)
	if !ok {
		return 0, errors.New("postgresdb: not a pgx connection")
	}
	conn := c.Conn()
	if len(args) == 0 {
		mrr := conn.PgConn().Exec(ctx, "BEGIN;\n"+query)
		var tag pgconn.CommandTag
		for mrr.NextResult() {
			tag, _ = mrr.ResultReader().Close()
		}
		if err := mrr.Close(); err != nil {
			return 0, err
		}
		return tag.RowsAffected(), nil
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(query, args...)
	br := conn.SendBatch(ctx, b)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag.RowsAffected(), err
}

// BeginQuery sends BEGIN and query as one pgx batch (one write, one Sync:
// the BEGIN opens a transaction block that the Sync leaves open) and scans
// the query's rows.
func (pipeline) BeginQuery(ctx context.Context, dc any, query string, args []any, dest func() []any) error {
	c, ok := dc.(pgxConn)
	if !ok {
		return errors.New("postgresdb: not a pgx connection")
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(query, args...)
	br := c.Conn().SendBatch(ctx, b)
	err := func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(dest()...); err != nil {
				return err
			}
		}
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// CommitStatements sends stmts and COMMIT as one pgx batch: one write, one
// Sync. A failed statement makes PostgreSQL skip the rest and the COMMIT.
func (pipeline) CommitStatements(ctx context.Context, dc any, stmts []gormstore.Statement) error {
	c, ok := dc.(pgxConn)
	if !ok {
		return errors.New("postgresdb: not a pgx connection")
	}
	b := &pgx.Batch{}
	for _, st := range stmts {
		b.Queue(st.SQL, st.Args...)
	}
	b.Queue("COMMIT")
	br := c.Conn().SendBatch(ctx, b)
	err := func() error {
		for _, st := range stmts {
			if st.Dest == nil {
				if _, err := br.Exec(); err != nil {
					return err
				}
				continue
			}
			rows, err := br.Query()
			if err != nil {
				return err
			}
			for rows.Next() {
				if err := rows.Scan(st.Dest()...); err != nil {
					rows.Close()
					return err
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		if tag.String() != "COMMIT" {
			// COMMIT of a failed transaction answers ROLLBACK.
			return pgx.ErrTxCommitRollback
		}
		return nil
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// RunThenBegin sends query (a transaction of its own) and BEGIN in one
// write through pgconn's pipeline, with a Sync after each: statements
// before one Sync are one implicit transaction, into which a BEGIN would
// fold the query. The arguments go as text, their types inferred by the
// server; strings, byte slices, integers, floats and nil only. The query
// is prepared on the connection the first time (one round trip more).
func (pipeline) RunThenBegin(ctx context.Context, dc any, query string, args []any, dest func() []any) error {
	c, ok := dc.(pgxConn)
	if !ok {
		return errors.New("postgresdb: not a pgx connection")
	}
	params := make([][]byte, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case nil:
		case string:
			params[i] = []byte(v)
		case []byte:
			params[i] = v
		case int:
			params[i] = strconv.AppendInt(nil, int64(v), 10)
		case int64:
			params[i] = strconv.AppendInt(nil, v, 10)
		case float64:
			params[i] = strconv.AppendFloat(nil, v, 'g', -1, 64)
		default:
			return fmt.Errorf("postgresdb: RunThenBegin: argument %d of type %T not supported", i, a)
		}
	}
	conn := c.Conn()
	// Prepared once per connection (pgx keeps it by its SQL), as pgx's
	// own statements are: an unnamed statement would be parsed and
	// planned by the server on every call.
	sd, err := conn.Prepare(ctx, query, query)
	if err != nil {
		return err
	}
	p := conn.PgConn().StartPipeline(ctx)
	p.SendQueryStatement(sd, params, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams("BEGIN", nil, nil, nil, nil)
	err = p.Sync()
	if err == nil {
		err = readPipeline(p, conn, dest)
	}
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	return err
}

// readPipeline reads RunThenBegin's results up to its second Sync: the
// query's rows, BEGIN's result. The query's error comes first; a broken
// connection ends the read.
func readPipeline(p *pgconn.Pipeline, conn *pgx.Conn, dest func() []any) error {
	var qerr, berr error
	for syncs := 0; syncs < 2; {
		res, err := p.GetResults()
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				return errors.Join(qerr, err)
			}
			// A statement's error: PostgreSQL skips to its Sync.
			if syncs == 0 {
				qerr = err
			} else {
				berr = err
			}
			continue
		}
		switch r := res.(type) {
		case *pgconn.ResultReader:
			if syncs == 0 {
				fds := r.FieldDescriptions()
				for r.NextRow() {
					if qerr == nil {
						qerr = pgx.ScanRow(conn.TypeMap(), fds, r.Values(), dest()...)
					}
				}
			}
			if _, err := r.Close(); err != nil {
				if syncs == 0 && qerr == nil {
					qerr = err
				} else if syncs > 0 {
					berr = err
				}
			}
		case *pgconn.PipelineSync:
			syncs++
		case nil:
			return errors.Join(qerr, errors.New("postgresdb: pipeline ended before its Sync"))
		}
	}
	if qerr != nil {
		return qerr
	}
	return berr
}
