package pgtransport

import (
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// Open builds a transport the way bus.New does, from a copy of cfg.
func Open(db *gorm.DB, cfg Config, log *slog.Logger) (*Transport, error) {
	return OpenNotify(db, cfg, log, nil)
}

// OpenNotify is Open with transport.Env.OnCommitted set.
func OpenNotify(db *gorm.DB, cfg Config, log *slog.Logger, onCommitted func([]*outbox.Message)) (*Transport, error) {
	t := New(db, func(c *Config) { *c = cfg })
	if _, err := t.Build(transport.Env{Logger: log, OnCommitted: onCommitted}); err != nil {
		return nil, err
	}
	return t, nil
}

// SetServerVersionNum makes t take num for the server's
// server_version_num instead of asking it. Call it before Start.
func (t *Transport) SetServerVersionNum(num int) { t.versionNum = num }

// SetDeliverTimeout overrides the bound of one Deliver (half of RelayLease,
// at most 30s). Call it before Start.
func (t *Transport) SetDeliverTimeout(d time.Duration) { t.deliverTimeout = d }

// SetMigrateTurnTimeout changes how long Start waits for another process
// migrating the same tables (a PostgreSQL interval, "1s"); it returns a
// function that restores the default.
func SetMigrateTurnTimeout(d string) (restore func()) {
	old := migrateTurnTimeout
	migrateTurnTimeout = d
	return func() { migrateTurnTimeout = old }
}

// HoldMigrateTurn takes, in tx, the advisory lock that processes migrating
// the tables of prefix take turns on.
func HoldMigrateTurn(tx *gorm.DB, prefix string) error {
	return tx.Exec("SELECT pg_advisory_xact_lock(?)", advisoryKey("barewire:pgtransport:"+namesFor(prefix).messages)).Error
}
