package gormstore

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/internal/xactwatch"
)

// WatchStats are the commit watcher's counters.
type WatchStats = watchStats

// WatchStats reports the commit watcher's counters (zero on SQLite).
func (o *Outbox) WatchStats() WatchStats {
	if o.watch == nil {
		return WatchStats{}
	}
	return o.watch.stats()
}

// SetWatchTiming changes the commit watcher's timing; zero values keep the
// default. Call it before the first Add.
func (o *Outbox) SetWatchTiming(maxInterval, expiry time.Duration, maxPending int) {
	o.watch.SetTiming(xactwatch.Config{MaxInterval: maxInterval, Expiry: expiry, MaxPending: maxPending})
}

// PgxConnError is Listen's verdict on a driver connection (what
// database/sql's Conn.Raw hands it): nil for pgx's stdlib connection.
func PgxConnError(dc any) error {
	_, err := pgxConn(dc)
	return err
}

// SetServerVersionNum makes s take num for PostgreSQL's server_version_num
// instead of asking the server.
func (s *Store) SetServerVersionNum(num int) {
	s.versionNum = func(context.Context) (int, error) { return num, nil }
}

// ClaimHeldSQL is ClaimBatch's claim statement (PostgreSQL; $1 the hold in
// milliseconds as text, $2 the limit).
func (o *Outbox) ClaimHeldSQL() string { return o.claimHeldSQL }

// SetMigrateTurnTimeout changes how long Migrate waits for another
// migrator of its prefix (a PostgreSQL interval, "1s"); it returns a
// function that restores the default.
func SetMigrateTurnTimeout(d string) (restore func()) {
	old := migrateTurnTimeout
	migrateTurnTimeout = d
	return func() { migrateTurnTimeout = old }
}

// HoldMigrateTurn takes, in tx, the advisory lock migrators of prefix
// take turns on.
func HoldMigrateTurn(tx *gorm.DB, prefix string) error {
	return tx.Exec("SELECT pg_advisory_xact_lock(?)", advisoryKey("barewire:migrate:"+prefix)).Error
}
