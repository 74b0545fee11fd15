package gormstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/inbox/inboxtest"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/outbox/outboxtest"
)

// filesBackend opens empty stores whose tables were made by running the
// migration files as they are (testenv.ApplyMigrationFiles), with the
// default prefix: each SQLite store in a database of its own, each
// PostgreSQL store in a schema of its own.
type filesBackend struct {
	name string
	// open returns a database holding nothing, and its name (PostgreSQL:
	// the schema).
	open func(t *testing.T) (db *gorm.DB, schema string)
}

func sqliteFiles() filesBackend {
	return filesBackend{name: "sqlite", open: func(t *testing.T) (*gorm.DB, string) {
		t.Helper()
		db, err := gormstore.OpenSQLite("")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeDB(t, db) })
		return db, "main"
	}}
}

func postgresFiles(t *testing.T) filesBackend {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	base, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(t, base) })
	baseSQL := sqlDB(t, base)
	return filesBackend{name: "postgres", open: func(t *testing.T) (*gorm.DB, string) {
		t.Helper()
		schema, schemaDSN := testenv.PostgresSchema(t, baseSQL, dsn)
		db, err := postgresdb.Open(schemaDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeDB(t, db) })
		return db, schema
	}}
}

func filesBackends(t *testing.T, fn func(t *testing.T, b filesBackend)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, sqliteFiles()) })
	t.Run("postgres", func(t *testing.T) { fn(t, postgresFiles(t)) })
}

// fromFiles returns a store on tables made from the migration files.
func (b filesBackend) fromFiles(t *testing.T) (*gormstore.Store, *gorm.DB) {
	t.Helper()
	db, _ := b.open(t)
	fsys, err := gormstore.Migrations(b.name)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ApplyMigrationFiles(t, sqlDB(t, db), fsys)
	s, err := gormstore.New(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.CheckSchema(t.Context()); err != nil {
		t.Fatalf("CheckSchema on tables made from the files: %v", err)
	}
	return s, db
}

func sqlDB(t *testing.T, db *gorm.DB) *sql.DB {
	t.Helper()
	s, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMigrationFilesMakeTheSchemaOfMigrate: the files, run as they are,
// and Migrate (here with another prefix) make the same tables, columns,
// defaults, constraints and indexes, so that a team applying the files
// with its own tool gets what Migrate would have made.
func TestMigrationFilesMakeTheSchemaOfMigrate(t *testing.T) {
	filesBackends(t, func(t *testing.T, b filesBackend) {
		s, db := b.fromFiles(t)
		fromFiles := catalog(t, b.name, db, schemaOf(t, b, db), s.TablePrefix())

		migratedDB, migratedSchema := b.open(t)
		prefix := "mig_x_"
		m, err := gormstore.New(migratedDB, gormstore.WithTablePrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		if err := m.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		fromMigrate := catalog(t, b.name, migratedDB, migratedSchema, prefix)

		for _, want := range []string{"barewire_inbox", "barewire_outbox", "barewire_outbox_due_idx", "payload"} {
			if !slices.ContainsFunc(fromFiles, func(l string) bool { return strings.Contains(l, want) }) {
				t.Errorf("the catalog of the files' schema does not mention %s:\n%s", want, strings.Join(fromFiles, "\n"))
			}
		}
		if !slices.Equal(fromFiles, fromMigrate) {
			t.Errorf("the files and Migrate made different schemas\nfiles:\n%s\nMigrate:\n%s", strings.Join(fromFiles, "\n"), strings.Join(fromMigrate, "\n"))
		}
	})
}

// schemaOf returns the schema db's pool works in.
func schemaOf(t *testing.T, b filesBackend, db *gorm.DB) string {
	t.Helper()
	if b.name == "sqlite" {
		return "main"
	}
	var schema string
	if err := db.Raw("SELECT current_schema()").Scan(&schema).Error; err != nil {
		t.Fatal(err)
	}
	return schema
}

// catalog describes the schema that holds the tables of prefix, one sorted
// line each, with prefix written as barewire_.
func catalog(t *testing.T, dialect string, db *gorm.DB, schema, prefix string) []string {
	t.Helper()
	sdb := sqlDB(t, db)
	if dialect == gormstore.DialectPostgres {
		return testenv.PostgresCatalog(t, sdb, schema, prefix, gormstore.DefaultTablePrefix)
	}
	var lines []string
	add := func(query string, args ...any) {
		t.Helper()
		for _, l := range testenv.QueryLines(t, sdb, query, args...) {
			lines = append(lines, strings.ReplaceAll(l, prefix, gormstore.DefaultTablePrefix))
		}
	}
	add(`SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite%'`)
	var tables, indexes []string
	if err := db.Raw(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'`).Scan(&tables).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Raw(`SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite%'`).Scan(&indexes).Error; err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tables {
		add(`SELECT ? AS tbl, * FROM pragma_table_xinfo(?)`, tbl, tbl)
		add(`SELECT ? AS tbl, * FROM pragma_index_list(?)`, tbl, tbl)
	}
	for _, idx := range indexes {
		add(`SELECT ? AS idx, * FROM pragma_index_xinfo(?)`, idx, idx)
	}
	slices.Sort(lines)
	return lines
}

// TestConformanceOnTablesFromFiles runs the inbox and outbox suites on
// stores whose tables were made by the migration files, not by Migrate.
func TestConformanceOnTablesFromFiles(t *testing.T) {
	filesBackends(t, func(t *testing.T, b filesBackend) {
		t.Run("inbox", func(t *testing.T) {
			inboxtest.Run(t, func(t *testing.T) inbox.Store {
				s, _ := b.fromFiles(t)
				return s.Inbox()
			})
		})
		t.Run("outbox", func(t *testing.T) {
			var opts []outboxtest.Option
			if b.name == "sqlite" {
				opts = append(opts, outboxtest.SerialTransactions())
			}
			outboxtest.Run(t, func(t *testing.T) (outbox.Store, outboxtest.InTx) {
				s, db := b.fromFiles(t)
				return s.Outbox(), inTx(db)
			}, opts...)
		})
	})
}

// TestCheckSchemaNamesWhatIsMissing: CheckSchema changes nothing and names
// every missing table and index with the file that creates it.
func TestCheckSchemaNamesWhatIsMissing(t *testing.T) {
	filesBackends(t, func(t *testing.T, b filesBackend) {
		ctx := t.Context()
		db, _ := b.open(t)
		prefix := "chk_"
		s, err := gormstore.New(db, gormstore.WithTablePrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		file := "migrations/" + b.name + "/001_init.sql"
		file2 := "migrations/" + b.name + "/002_ordering_key.sql"

		err = s.CheckSchema(ctx)
		var se *gormstore.SchemaError
		if !errors.As(err, &se) {
			t.Fatalf("CheckSchema on an empty database = %v, want a *SchemaError", err)
		}
		var got []string
		for _, o := range se.Missing {
			got = append(got, o.Kind+" "+o.Name+" "+o.File)
		}
		want := []string{
			"table chk_inbox " + file, "index chk_inbox_processed_idx " + file, "index chk_inbox_expires_idx " + file, "index chk_inbox_received_idx " + file,
			"table chk_outbox " + file, "index chk_outbox_due_idx " + file, "index chk_outbox_message_idx " + file, "index chk_outbox_delivered_idx " + file, "index chk_outbox_parked_idx " + file,
			"column chk_outbox.ordering_key " + file2, "index chk_outbox_key_idx " + file2,
		}
		if !slices.Equal(got, want) {
			t.Errorf("missing = %q\nwant %q", got, want)
		}
		msg := err.Error()
		for _, part := range []string{"table chk_inbox", "table chk_outbox", "index chk_outbox_parked_idx", file, `gormstore.MigrationSQL("` + b.name + `", "chk_")`} {
			if !strings.Contains(msg, part) {
				t.Errorf("the error does not mention %q: %s", part, msg)
			}
		}
		var tables int64
		if err := db.Raw(tableCountSQL(b.name), prefix+"%").Scan(&tables).Error; err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Fatalf("CheckSchema created %d tables", tables)
		}

		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.CheckSchema(ctx); err != nil {
			t.Fatalf("CheckSchema after Migrate: %v", err)
		}
		if err := db.Exec("DROP INDEX " + prefix + "inbox_expires_idx").Error; err != nil {
			t.Fatal(err)
		}
		err = s.CheckSchema(ctx)
		if !errors.As(err, &se) || len(se.Missing) != 1 || se.Missing[0].Name != prefix+"inbox_expires_idx" || se.Missing[0].Kind != "index" {
			t.Fatalf("CheckSchema without one index = %v, want it named alone", err)
		}

		// With the default prefix the error points at the files.
		d, err := gormstore.New(db)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CheckSchema(ctx); err == nil || !strings.Contains(err.Error(), `gormstore.Migrations("`+b.name+`")`) {
			t.Errorf("CheckSchema with the default prefix = %v, want it to name gormstore.Migrations", err)
		}
	})
}

func tableCountSQL(dialect string) string {
	if dialect == gormstore.DialectSQLite {
		return "SELECT count(*) FROM sqlite_master WHERE name LIKE ?"
	}
	return "SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relname LIKE ?"
}

// TestOlderPostgresFailsAtMigrateAndCheck: on a server older than 13 (here
// a pretended server_version_num) Migrate and CheckSchema fail with
// ErrPostgresVersion, naming the version, before touching the schema.
func TestOlderPostgresFailsAtMigrateAndCheck(t *testing.T) {
	db, _ := postgresFiles(t).open(t)
	ctx := t.Context()
	for _, tc := range []struct {
		num  int
		name string
	}{{120004, "12.4"}, {90624, "9.6.24"}} {
		s, err := gormstore.New(db)
		if err != nil {
			t.Fatal(err)
		}
		s.SetServerVersionNum(tc.num)
		for what, run := range map[string]func(context.Context) error{"Migrate": s.Migrate, "CheckSchema": s.CheckSchema} {
			err := run(ctx)
			if !errors.Is(err, gormstore.ErrPostgresVersion) {
				t.Fatalf("%s on %d = %v, want ErrPostgresVersion", what, tc.num, err)
			}
			if !strings.Contains(err.Error(), "PostgreSQL "+tc.name) || !strings.Contains(err.Error(), "13 or newer") {
				t.Errorf("%s: the error does not say which version: %v", what, err)
			}
		}
	}
	var tables int64
	if err := db.Raw(tableCountSQL(gormstore.DialectPostgres), "%").Scan(&tables).Error; err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("Migrate on a too old server created %d relations", tables)
	}
	// 13 passes.
	s, err := gormstore.New(db)
	if err != nil {
		t.Fatal(err)
	}
	s.SetServerVersionNum(130000)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate on 13: %v", err)
	}
}

// TestMigrationFilesAreGooseMigrations: each file is what goose accepts and
// what any other tool runs as plain SQL: one "-- +goose Up" line (at the
// start of its line), only comments before it, no Down section, and every
// statement ends with ';' at the end of a line. MigrationSQL's script has
// the same shape.
func TestMigrationFilesAreGooseMigrations(t *testing.T) {
	for _, dialect := range []string{gormstore.DialectPostgres, gormstore.DialectSQLite} {
		fsys, err := gormstore.Migrations(dialect)
		if err != nil {
			t.Fatal(err)
		}
		names, err := fs.Glob(fsys, "*.sql")
		if err != nil || len(names) == 0 {
			t.Fatalf("%s: no migration files (%v)", dialect, err)
		}
		for i, name := range names {
			if !regexp.MustCompile(`^\d+_[a-z0-9_]+\.sql$`).MatchString(name) {
				t.Errorf("%s/%s: goose and Atlas want <version>_<name>.sql", dialect, name)
			}
			if !strings.HasPrefix(name, fmt.Sprintf("%03d_", i+1)) {
				t.Errorf("%s/%s: files must be numbered 001, 002, ... without gaps", dialect, name)
			}
			data, err := fs.ReadFile(fsys, name)
			if err != nil {
				t.Fatal(err)
			}
			checkGooseShape(t, dialect+"/"+name, string(data))
		}
		script, err := gormstore.MigrationSQL(dialect, "acme_")
		if err != nil {
			t.Fatal(err)
		}
		checkGooseShape(t, "MigrationSQL("+dialect+")", script)
	}
}

func checkGooseShape(t *testing.T, name, text string) {
	t.Helper()
	ups := 0
	pendingStatement := false
	for line := range strings.Lines(text) {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "-- +goose"):
			if trimmed != "-- +goose Up" || line != "-- +goose Up\n" {
				t.Errorf("%s: annotation %q: only %q, at the start of its line", name, trimmed, "-- +goose Up")
			}
			ups++
		case trimmed == "" || strings.HasPrefix(trimmed, "--"):
		default:
			if ups == 0 {
				t.Errorf("%s: SQL before the Up annotation: %q", name, trimmed)
			}
			pendingStatement = !strings.HasSuffix(trimmed, ";")
			if strings.Count(trimmed, ";") > 1 || (strings.Contains(trimmed, ";") && !strings.HasSuffix(trimmed, ";")) {
				t.Errorf("%s: a ';' inside a statement: %q", name, trimmed)
			}
		}
	}
	if ups != 1 {
		t.Errorf("%s: %d Up annotations, want 1", name, ups)
	}
	if pendingStatement {
		t.Errorf("%s: the last statement does not end with ';'", name)
	}
}
