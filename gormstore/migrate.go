package gormstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/internal/migration"
	"github.com/barewire-go/barewire/internal/pgerr"
)

// Migrate creates the tables and indexes, or brings them up to date. It is
// idempotent and safe while other instances run traffic on the tables or
// migrate at the same moment:
//
//   - On PostgreSQL it first checks that the server is PostgreSQL 13 or
//     newer (an error wrapping ErrPostgresVersion otherwise).
//   - It asks the catalog whether every table and index the script
//     creates exists. If so it returns without running any DDL: on
//     PostgreSQL even CREATE INDEX IF NOT EXISTS locks the table (SHARE,
//     until commit), which can deadlock with live transactions.
//   - Otherwise it executes exactly the statements MigrationSQL returns, in
//     one transaction. On PostgreSQL that transaction first takes an
//     advisory lock per prefix (migrators take turns), then runs with a
//     lock_timeout of 5s so that it never queues traffic behind it for long,
//     and is retried, at most 5 times in all, when PostgreSQL aborts it for
//     a deadlock (40P01), a serialization failure (40001) or the lock
//     timeout (55P03).
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.checkVersion(ctx); err != nil {
		return err
	}
	script, err := MigrationSQL(s.dialect.name, s.prefix)
	if err != nil {
		return err
	}
	stmts := migration.Statements(script)
	objects, provable := createdObjects(stmts)
	if provable {
		ok, err := s.schemaPresent(ctx, s.db.WithContext(ctx), objects)
		if err != nil {
			return fmt.Errorf("gormstore: migrate: %w", err)
		}
		if ok {
			return nil
		}
	}
	delay := migrateRetryDelay
	for attempt := 1; ; attempt++ {
		err = s.migrateOnce(ctx, stmts, objects, provable)
		if err == nil || attempt == migrateAttempts || !retryableMigrateError(err) || ctx.Err() != nil {
			break
		}
		// Jitter keeps two migrators that deadlocked from meeting again.
		t := time.NewTimer(delay + rand.N(delay))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gormstore: migrate: %w (while retrying after: %w)", ctx.Err(), err)
		case <-t.C:
		}
		delay *= 2
	}
	if err != nil {
		return fmt.Errorf("gormstore: migrate: %w", err)
	}
	return nil
}

// Migrate's retry policy (variables for tests).
var (
	migrateAttempts   = 5
	migrateRetryDelay = 100 * time.Millisecond
)

// migrateLockTimeout bounds how long one DDL statement waits for a table
// lock; waiting DDL holds up every later writer of that table.
const migrateLockTimeout = "5s"

// migrateTurnTimeout bounds the wait for another migrator of the same
// prefix (a variable for tests).
var migrateTurnTimeout = "30s"

// turnError is a migration that waited migrateTurnTimeout for another
// migrator of its prefix: not retried, since that one may hold its turn
// much longer (a frozen process keeps its transaction open).
type turnError struct {
	prefix string
	err    error
}

func (e *turnError) Error() string {
	return fmt.Sprintf("another process has held the migration lock of table prefix %q for over %s (a migration running in a frozen or slow process?): %v", e.prefix, migrateTurnTimeout, e.err)
}

func (e *turnError) Unwrap() error { return e.err }

func (s *Store) migrateOnce(ctx context.Context, stmts, objects []string, provable bool) error {
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if s.dialect.name == DialectPostgres {
			// CREATE ... IF NOT EXISTS is not safe against a concurrent
			// CREATE (both may pass the check, one then fails on the catalog's
			// unique index), so concurrent migrators take turns. The lock is
			// per prefix and released at commit. The wait for it is bounded
			// by migrateTurnTimeout: a migrator frozen or stuck holding it
			// fails this one with a clear error instead of hanging Start.
			if err := tx.Exec("SELECT set_config('lock_timeout', ?, true)", migrateTurnTimeout).Error; err != nil {
				return err
			}
			if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", advisoryKey("barewire:migrate:"+s.prefix)).Error; err != nil {
				if pgerr.SQLState(err) == "55P03" {
					return &turnError{prefix: s.prefix, err: err}
				}
				return err
			}
			// The migrator before us may have done the work.
			if provable {
				if ok, err := s.schemaPresent(ctx, tx, objects); err != nil || ok {
					return err
				}
			}
			if err := tx.Exec("SELECT set_config('lock_timeout', ?, true)", migrateLockTimeout).Error; err != nil {
				return err
			}
		}
		// Skip an ADD COLUMN whose column exists (SQLite's has no IF NOT
		// EXISTS); every other statement runs again, idempotently.
		var missing map[string]bool
		if provable {
			var err error
			if missing, err = s.missingObjects(ctx, tx, objects); err != nil {
				return err
			}
		}
		for i, stmt := range stmts {
			if provable && strings.Contains(objects[i], ".") && !missing[objects[i]] {
				continue
			}
			if err := tx.Exec(stmt).Error; err != nil {
				return fmt.Errorf("%w\nstatement:\n%s", err, stmt)
			}
		}
		return nil
	})
}

// retryableMigrateError reports whether PostgreSQL aborted the migration for
// a reason that a second attempt may not meet.
func retryableMigrateError(err error) bool {
	var te *turnError
	if errors.As(err, &te) {
		return false
	}
	switch pgerr.SQLState(err) {
	case "40P01", // deadlock_detected
		"40001", // serialization_failure
		"55P03": // lock_not_available (lock_timeout)
		return true
	}
	return false
}

// createdObjects lists the tables and indexes that stmts create. provable
// is false when some statement is of another kind: then only running the
// script brings the schema up to date, and Migrate always runs it.
func createdObjects(stmts []string) (objects []string, provable bool) {
	for _, stmt := range stmts {
		o, ok := migration.Created(stmt)
		if !ok {
			return nil, false
		}
		objects = append(objects, o.Name)
	}
	return objects, len(objects) > 0
}

// schemaPresent reports whether every one of objects exists.
func (s *Store) schemaPresent(ctx context.Context, db *gorm.DB, objects []string) (bool, error) {
	missing, err := s.missingObjects(ctx, db, objects)
	return len(missing) == 0, err
}
