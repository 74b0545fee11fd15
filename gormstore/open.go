package gormstore

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/glebarez/sqlite"
	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// OpenSQLite opens an SQLite database with the pure-Go driver
// (github.com/glebarez/sqlite) set up for the stores:
//
//   - path "" opens a private in-memory database; every call gets its own.
//   - a file path opens (or creates) that file in WAL mode with a 5 s busy
//     timeout and BEGIN IMMEDIATE transactions.
//   - foreign keys are enforced and GORM's logger is silent.
//   - the pool holds exactly one connection, kept open for the life of the
//     *gorm.DB: SQLite admits one writer at a time, so a single connection
//     turns lock contention (SQLITE_BUSY) into waiting in the pool, and an
//     in-memory database lives as long as its connection.
//
// The single connection means a transaction (such as the one Inbox.Process
// runs a handler in) holds the database: do all work inside it through the
// transaction from the context, never through this *gorm.DB, or it waits
// for itself. Close the database with Close.
//
// An in-memory database is also held open by a second, idle "anchor"
// connection: database/sql discards a connection whose transaction's
// context is cancelled mid-statement, and without the anchor that would
// drop the whole in-memory database with it.
func OpenSQLite(path string) (*gorm.DB, error) {
	params := url.Values{}
	params.Add("_pragma", "foreign_keys(1)")
	var dsn string
	if path == "" {
		// A unique name gives each call its own database; mode=memory keeps
		// it off disk.
		params.Set("mode", "memory")
		params.Set("cache", "shared")
		dsn = "file:barewire-" + uuid.NewString() + "?" + params.Encode()
	} else {
		params.Add("_pragma", "journal_mode(WAL)")
		params.Add("_pragma", "busy_timeout(5000)")
		params.Add("_pragma", "synchronous(NORMAL)")
		// A transaction takes the write lock when it begins rather than at
		// its first write, so two transactions never deadlock upgrading
		// (relevant when another process opens the same file).
		params.Set("_txlock", "immediate")
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&" // the caller passed parameters of their own
		}
		dsn = path + sep + params.Encode()
	}
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		closeQuietly(db)
		return nil, fmt.Errorf("gormstore: open sqlite %q: %w", path, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("gormstore: open sqlite %q: %w", path, err)
	}
	sqlDB.SetMaxOpenConns(1)
	sqlDB.SetMaxIdleConns(1)
	sqlDB.SetConnMaxLifetime(0)
	sqlDB.SetConnMaxIdleTime(0)
	if path == "" {
		anchor, err := sql.Open(sqlite.DriverName, dsn)
		if err == nil {
			anchor.SetMaxOpenConns(1)
			anchor.SetConnMaxLifetime(0)
			anchor.SetConnMaxIdleTime(0)
			err = anchor.Ping()
		}
		if err != nil {
			_ = sqlDB.Close()
			if anchor != nil {
				_ = anchor.Close()
			}
			return nil, fmt.Errorf("gormstore: open in-memory sqlite: %w", err)
		}
		anchors.Store(sqlDB, anchor)
	}
	return db, nil
}

// anchors maps an in-memory database's pool to its anchor connection.
var anchors sync.Map // *sql.DB → *sql.DB

// Close closes db's connection pool and, for an in-memory SQLite database
// opened by OpenSQLite, its anchor connection (which frees the database).
func Close(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("gormstore: close: %w", err)
	}
	err = sqlDB.Close()
	if a, ok := anchors.LoadAndDelete(sqlDB); ok {
		err = errors.Join(err, a.(*sql.DB).Close())
	}
	return err
}

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
