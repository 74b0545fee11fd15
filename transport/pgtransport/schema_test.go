package pgtransport_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport/pgtransport"
)

// schemaEnv gives a test PostgreSQL schemas of its own, so that tables may
// keep the default prefix the migration files spell.
type schemaEnv struct {
	dsn  string
	base *gorm.DB
}

func newSchemaEnv(t *testing.T) *schemaEnv {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(db) })
	return &schemaEnv{dsn: dsn, base: db}
}

// open returns a new empty schema and a pool working in it.
func (e *schemaEnv) open(t *testing.T) (*gorm.DB, string) {
	t.Helper()
	sqlDB, err := e.base.DB()
	if err != nil {
		t.Fatal(err)
	}
	schema, dsn := testenv.PostgresSchema(t, sqlDB, e.dsn)
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(db) })
	return db, schema
}

// fromFiles returns a new schema holding the tables made by running the
// transport's migration files as they are.
func (e *schemaEnv) fromFiles(t *testing.T) (*gorm.DB, string) {
	t.Helper()
	db, schema := e.open(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	testenv.ApplyMigrationFiles(t, sqlDB, pgtransport.Migrations())
	return db, schema
}

func startErr(t *testing.T, db *gorm.DB, cfg pgtransport.Config, prepare func(*pgtransport.Transport)) (*pgtransport.Transport, error) {
	t.Helper()
	tr, err := pgtransport.Open(db, cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	if prepare != nil {
		prepare(tr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return tr, tr.Start(ctx, endpoints(t, map[string][]string{"orders": {"OrderPlaced"}}))
}

// TestMigrationFilesMakeTheSchemaOfStart: the files, run as they are, and
// Start's own migration (here with another prefix) make the same tables,
// columns, defaults, constraints, storage options and indexes.
func TestMigrationFilesMakeTheSchemaOfStart(t *testing.T) {
	t.Parallel()
	e := newSchemaEnv(t)
	filesDB, filesSchema := e.fromFiles(t)
	startDB, startSchema := e.open(t)
	prefix := "mig_x_"
	if _, err := startErr(t, startDB, pgtransport.Config{TablePrefix: prefix}, nil); err != nil {
		t.Fatal(err)
	}
	filesSQL, _ := filesDB.DB()
	startSQL, _ := startDB.DB()
	fromFiles := testenv.PostgresCatalog(t, filesSQL, filesSchema, pgtransport.DefaultTablePrefix, pgtransport.DefaultTablePrefix)
	fromStart := testenv.PostgresCatalog(t, startSQL, startSchema, prefix, pgtransport.DefaultTablePrefix)
	for _, want := range []string{"barewire_queue_messages_queue_idx", "barewire_bindings_pkey", "fillfactor=90", "visible_at"} {
		if !slices.ContainsFunc(fromFiles, func(l string) bool { return strings.Contains(l, want) }) {
			t.Errorf("the catalog of the files' schema does not mention %s:\n%s", want, strings.Join(fromFiles, "\n"))
		}
	}
	if !slices.Equal(fromFiles, fromStart) {
		t.Errorf("the files and Start made different schemas\nfiles:\n%s\nStart:\n%s", strings.Join(fromFiles, "\n"), strings.Join(fromStart, "\n"))
	}
}

// TestDisableAutoMigrateOnTablesFromFiles: with the tables made by the
// files, a transport that does not migrate starts and carries messages.
func TestDisableAutoMigrateOnTablesFromFiles(t *testing.T) {
	t.Parallel()
	e := newSchemaEnv(t)
	db, _ := e.fromFiles(t)
	tr, err := startErr(t, db, pgtransport.Config{DisableAutoMigrate: true}, nil)
	if err != nil {
		t.Fatalf("Start on tables from the files: %v", err)
	}
	ch := subscribe(t, tr, t.Context(), "orders")
	deliver(t, tr, msg("m1", "exchange:OrderPlaced"))
	m := recv(t, ch)
	if m.UUID != "m1" || string(m.Payload) != "m1" {
		t.Fatalf("got %q %q", m.UUID, m.Payload)
	}
	m.Ack()
	eventually(t, "acked row deleted", func() bool { return queueLen(t, tr, "orders") == 0 })
}

// TestDisableAutoMigrateNamesMissingTables: Start without the tables fails
// at once, naming each missing table and index, the file that creates it
// and what to apply, and creates nothing.
func TestDisableAutoMigrateNamesMissingTables(t *testing.T) {
	t.Parallel()
	e := newSchemaEnv(t)
	db, schema := e.open(t)
	_, err := startErr(t, db, pgtransport.Config{DisableAutoMigrate: true}, nil)
	if err == nil {
		t.Fatal("Start without tables succeeded")
	}
	for _, part := range []string{
		"DisableAutoMigrate",
		"table barewire_queue_messages, index barewire_queue_messages_queue_idx, table barewire_queues, table barewire_bindings, index barewire_bindings_queue_idx (created by pgtransport's migrations/001_init.sql)",
		"pgtransport.Migrations()",
	} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("the error does not mention %q: %v", part, err)
		}
	}
	var n int64
	if err := db.Raw("SELECT count(*) FROM pg_class WHERE relnamespace = ?::regnamespace", schema).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("Start created %d relations", n)
	}

	// Another prefix: MigrationSQL is the way; one missing index is named alone.
	if _, err := startErr(t, db, pgtransport.Config{TablePrefix: "own_"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("DROP INDEX own_bindings_queue_idx").Error; err != nil {
		t.Fatal(err)
	}
	_, err = startErr(t, db, pgtransport.Config{TablePrefix: "own_", DisableAutoMigrate: true}, nil)
	if err == nil || !strings.Contains(err.Error(), "lacks index own_bindings_queue_idx (") || strings.Contains(err.Error(), "table") ||
		!strings.Contains(err.Error(), `pgtransport.MigrationSQL("own_")`) {
		t.Fatalf("Start without one index = %v, want it named alone with MigrationSQL", err)
	}
}

// TestOlderPostgresFailsAtStart: on a server older than 13 (a pretended
// server_version_num) Start fails with ErrPostgresVersion before creating
// anything, with auto-migration on or off.
func TestOlderPostgresFailsAtStart(t *testing.T) {
	t.Parallel()
	e := newSchemaEnv(t)
	db, schema := e.open(t)
	for _, disable := range []bool{false, true} {
		_, err := startErr(t, db, pgtransport.Config{DisableAutoMigrate: disable}, func(tr *pgtransport.Transport) { tr.SetServerVersionNum(120007) })
		if !errors.Is(err, gormstore.ErrPostgresVersion) || !strings.Contains(err.Error(), "PostgreSQL 12.7") {
			t.Fatalf("Start (DisableAutoMigrate %v) on 12.7 = %v, want ErrPostgresVersion naming 12.7", disable, err)
		}
	}
	var n int64
	if err := db.Raw("SELECT count(*) FROM pg_class WHERE relnamespace = ?::regnamespace", schema).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("Start on a too old server created %d relations", n)
	}
	if _, err := startErr(t, db, pgtransport.Config{}, func(tr *pgtransport.Transport) { tr.SetServerVersionNum(130000) }); err != nil {
		t.Fatalf("Start on 13: %v", err)
	}
}

func TestMigrationSQLIsTheFilesWithThePrefix(t *testing.T) {
	script, err := pgtransport.MigrationSQL("Acme_")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(script, "-- +goose Up\n") || strings.Contains(script, "barewire_") ||
		!strings.Contains(script, "CREATE TABLE IF NOT EXISTS acme_queue_messages (") ||
		!strings.Contains(script, "CREATE INDEX IF NOT EXISTS acme_bindings_queue_idx ON acme_bindings (queue);") {
		t.Errorf("MigrationSQL(Acme_):\n%s", script)
	}
	if _, err := pgtransport.MigrationSQL("1bad"); err == nil {
		t.Error("MigrationSQL accepted a bad prefix")
	}
}
