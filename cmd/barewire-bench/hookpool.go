package main

import (
	"context"
	"database/sql"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/barewire-go/barewire/gormstore/postgresdb"
)

// hookPool is a GORM connection pool whose transactions run callbacks right
// after they commit. The benchmark uses it to time the consumer's commit
// (the bus commits after the handler returns, so the handler cannot see
// that instant). It adds one pointer indirection per statement.
type hookPool struct{ *sql.DB }

// BeginTx implements gorm.ConnPoolBeginner.
func (p hookPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &hookTx{Tx: tx, db: p.DB}, nil
}

// GetDBConn implements gorm.GetDBConnector (db.DB() works as usual).
func (p hookPool) GetDBConn() (*sql.DB, error) { return p.DB, nil }

// hookTx is a transaction of hookPool.
type hookTx struct {
	*sql.Tx
	db    *sql.DB
	after []func(time.Time)
}

// Commit commits and then runs the after-commit callbacks with the instant
// the commit returned.
func (t *hookTx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	now := time.Now()
	for _, f := range t.after {
		f(now)
	}
	return nil
}

// GetDBConn implements gorm.GetDBConnector.
func (t *hookTx) GetDBConn() (*sql.DB, error) { return t.db, nil }

// afterCommit registers f to run once tx (a transaction of a hookPool
// database) commits. It reports false when tx is not such a transaction.
func afterCommit(tx *gorm.DB, f func(time.Time)) bool {
	if tx == nil {
		return false
	}
	h, ok := tx.Statement.ConnPool.(*hookTx)
	if !ok {
		return false
	}
	h.after = append(h.after, f)
	return true
}

// openHookedPostgres opens PostgreSQL through GORM on a hookPool with the
// same pool bounds postgresdb.Open uses unless maxConns says more.
func openHookedPostgres(dsn string, maxConns int) (*gorm.DB, error) {
	sqlDB, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	sqlDB.SetConnMaxLifetime(30 * time.Minute)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: hookPool{sqlDB}}), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		_ = sqlDB.Close()
		return nil, err
	}
	// As postgresdb.Open: bus.Transaction sends the outbox rows with its
	// COMMIT (its transactions then bypass hookPool.BeginTx).
	if err := db.Use(postgresdb.Pipeline()); err != nil {
		_ = sqlDB.Close()
		return nil, err
	}
	return db, nil
}
