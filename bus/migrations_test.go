package bus_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/pgtransport"
)

// applyFiles runs migration files on db as they are, as a team's own
// migration tool would.
func applyFiles(t *testing.T, db *gorm.DB, dialect string, withTransport bool) {
	t.Helper()
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := gormstore.Migrations(dialect)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ApplyMigrationFiles(t, sqlDB, fsys)
	if withTransport {
		testenv.ApplyMigrationFiles(t, sqlDB, pgtransport.Migrations())
	}
}

// exercise publishes straight and through the outbox and waits until the
// consumer has both, each marked processed in the inbox.
func exercise(t *testing.T, b *bus.Bus, rec *recorder, typ string) {
	t.Helper()
	ctx := context.Background()
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "p1"}, bus.Headers{bus.HeaderMessageID: "mig-1", bus.HeaderMessageType: typ}); err != nil {
		t.Fatal(err)
	}
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		return b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "p2"}, bus.Headers{bus.HeaderMessageID: "mig-2", bus.HeaderMessageType: typ})
	}); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 2)
	ids := map[string]bool{}
	for _, s := range got {
		ids[s.MessageID] = true
	}
	if !ids["mig-1"] || !ids["mig-2"] {
		t.Fatalf("consumed %+v, want mig-1 and mig-2", got)
	}
	for _, id := range []string{"mig-1", "mig-2"} {
		waitFor(t, func() bool { return processedEntries(t, b, id) == 1 })
	}
}

// TestDisableAutoMigrateOnTablesFromFilesSQLite: the embedded default on a
// SQLite file whose tables a migration tool made from the files, with
// auto-migration off, publishes and consumes.
func TestDisableAutoMigrateOnTablesFromFilesSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := gormstore.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	applyFiles(t, db, gormstore.DialectSQLite, false)
	if err := gormstore.Close(db); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	b := start(t, quiet(), bus.WithSQLite(path),
		bus.WithOutbox(func(o *outbox.Options) { o.DisableAutoMigrate = true }),
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("payments", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, paymentConsumer("payments", rec), endpoint.AsMessageType("Payment"))
			})
		})))
	exercise(t, b, rec, "Payment")
}

// TestDisableAutoMigrateWithoutTablesFailsStart: Start names the missing
// tables, the file that creates them and the option that stopped it from
// creating them, instead of failing at the first publish.
func TestDisableAutoMigrateWithoutTablesFailsStart(t *testing.T) {
	t.Parallel()
	b, err := bus.New(quiet(), bus.WithOutbox(func(o *outbox.Options) { o.DisableAutoMigrate = true }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = b.Start(ctx)
	if err == nil {
		_ = b.Stop(ctx)
		t.Fatal("Start without tables succeeded")
	}
	var se *gormstore.SchemaError
	if !errors.As(err, &se) || len(se.Missing) != 11 {
		t.Fatalf("Start = %v, want a *gormstore.SchemaError with the 11 tables, indexes and columns", err)
	}
	for _, part := range []string{"outbox.Options.DisableAutoMigrate", "table barewire_inbox", "table barewire_outbox", "migrations/sqlite/001_init.sql", `gormstore.Migrations("sqlite")`} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("the error does not mention %q: %v", part, err)
		}
	}
}

// TestDisableAutoMigrateOnTablesFromFilesPostgres: the PostgreSQL transport
// and the outbox on PostgreSQL, every table made by running the files as
// they are (default prefix, a schema of the test's own), auto-migration off
// on both: publishing and consuming work.
func TestDisableAutoMigrateOnTablesFromFilesPostgres(t *testing.T) {
	t.Parallel()
	db := schemaDB(t)
	applyFiles(t, db, gormstore.DialectPostgres, true)
	rec := newRecorder()
	b := start(t, quiet(),
		bus.WithTransport(pgtransport.New(db, func(p *pgtransport.Config) {
			p.DisableAutoMigrate = true
			p.ReceiveEndpoint("payments", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, paymentConsumer("payments", rec), endpoint.AsMessageType("Payment"))
			})
		})),
		bus.WithOutbox(func(o *outbox.Options) {
			o.DisableAutoMigrate = true
			// Publish goes through the outbox and the relay (PublishTx
			// writes to the queue in the caller's transaction).
			o.PublishThroughOutbox = true
		}))
	exercise(t, b, rec, "Payment")
	// The relay marks the row once the transport took it, which may be
	// after the consumer had it.
	waitFor(t, func() bool {
		var status string
		err := db.Raw("SELECT status FROM barewire_outbox WHERE message_id = ?", "mig-1").Scan(&status).Error
		return err == nil && status == string(outbox.StatusDelivered)
	})
}

// TestDisableAutoMigrateWithoutTransportTablesFailsStart: with the outbox's
// tables there but not the transport's, Start names the transport's.
func TestDisableAutoMigrateWithoutTransportTablesFailsStart(t *testing.T) {
	t.Parallel()
	db := schemaDB(t)
	applyFiles(t, db, gormstore.DialectPostgres, false)
	b, err := bus.New(quiet(),
		bus.WithTransport(pgtransport.New(db, func(p *pgtransport.Config) {
			p.DisableAutoMigrate = true
			p.ReceiveEndpoint("payments", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, paymentConsumer("payments", newRecorder()))
			})
		})),
		bus.WithOutbox(func(o *outbox.Options) { o.DisableAutoMigrate = true }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = b.Start(ctx)
	if err == nil {
		_ = b.Stop(ctx)
		t.Fatal("Start without the transport's tables succeeded")
	}
	for _, part := range []string{"DisableAutoMigrate", "table barewire_queue_messages", "table barewire_queues", "table barewire_bindings", "pgtransport.Migrations()"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("the error does not mention %q: %v", part, err)
		}
	}
	if strings.Contains(err.Error(), "barewire_inbox") {
		t.Errorf("the error names the inbox, which is there: %v", err)
	}
}

// schemaDB returns a pool on a PostgreSQL schema of the test's own.
func schemaDB(t *testing.T) *gorm.DB {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	base, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(base) })
	baseSQL, err := base.DB()
	if err != nil {
		t.Fatal(err)
	}
	_, schemaDSN := testenv.PostgresSchema(t, baseSQL, dsn)
	db, err := postgresdb.Open(schemaDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(db) })
	return db
}
