package gormstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/internal/migration"
)

// migrationFiles are the migrations, one folder per dialect. They spell
// DefaultTablePrefix; MigrationSQL substitutes the configured prefix.
//
//go:embed migrations/postgres/*.sql migrations/sqlite/*.sql
var migrationFiles embed.FS

// MinPostgresVersionNum is the oldest PostgreSQL server the stores run on,
// as server_version_num: PostgreSQL 13, which added pg_current_xact_id and
// pg_xact_status (the outbox's commit watcher uses both).
const MinPostgresVersionNum = 130000

// ErrPostgresVersion is wrapped by the errors of Migrate and CheckSchema on
// a PostgreSQL server older than 13.
var ErrPostgresVersion = errors.New("PostgreSQL 13 or newer is required")

// Migrations returns the migration files of dialect ("postgres" or
// "sqlite"): a file system whose root holds 001_init.sql (and, in later
// releases, 002_... and so on), as they are in the module under
// gormstore/migrations/<dialect>/. They create the tables with the default
// prefix, barewire_; for another prefix use MigrationSQL.
//
// Each file is a goose migration and a plain SQL script at once: goose runs
// what follows its "-- +goose Up" line, and Atlas, psql or any tool that
// runs a file as it is reads that line as a comment. The files have no Down
// section (rolling back would drop messages not yet relayed). Hand the file
// system to goose (goose.NewProvider(goose.DialectPostgres, db, fsys)) or
// copy the files into your migrations folder, renumbered to fit its
// sequence. Every statement is idempotent.
func Migrations(dialect string) (fs.FS, error) {
	if _, err := dialectFor(dialect); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(migrationFiles, path.Join("migrations", dialect))
	if err != nil {
		return nil, fmt.Errorf("gormstore: migrations: %w", err)
	}
	return sub, nil
}

// MigrationSQL returns the SQL that creates the tables for dialect
// ("postgres" or "sqlite") with table names starting with prefix: one
// "-- +goose Up" line, then the statements of the migration files
// (Migrations) in order, with prefix in place of barewire_. Every statement
// is idempotent. Migrate executes exactly these statements; the script is
// for teams whose migration tool owns the schema (it is a goose migration
// as it is, and plain SQL to every other tool).
func MigrationSQL(dialect, prefix string) (string, error) {
	if err := validatePrefix(prefix); err != nil {
		return "", err
	}
	files, err := readMigrations(dialect)
	if err != nil {
		return "", err
	}
	return migration.Script(files, DefaultTablePrefix, prefix), nil
}

func readMigrations(dialect string) ([]migration.File, error) {
	fsys, err := Migrations(dialect)
	if err != nil {
		return nil, err
	}
	files, err := migration.Read(fsys)
	if err != nil {
		return nil, fmt.Errorf("gormstore: %w", err)
	}
	return files, nil
}

// SchemaObject is a table or an index that a migration file creates.
type SchemaObject struct {
	Kind string // "table" or "index"
	Name string // with the store's prefix
	File string // the migration that creates it, e.g. "migrations/postgres/001_init.sql"
}

// SchemaError is the error of CheckSchema when tables or indexes are
// missing.
type SchemaError struct {
	Dialect string
	Prefix  string
	// Missing lists what is not there, in the order the migrations create
	// it.
	Missing []SchemaObject
}

func (e *SchemaError) Error() string {
	var b strings.Builder
	b.WriteString("gormstore: the database lacks ")
	for i, o := range e.Missing {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", o.Kind, o.Name)
		if i == len(e.Missing)-1 || e.Missing[i+1].File != o.File {
			fmt.Fprintf(&b, " (created by gormstore's %s)", o.File)
		}
	}
	if e.Prefix == DefaultTablePrefix {
		fmt.Fprintf(&b, "; apply the files of gormstore.Migrations(%q) with your migration tool", e.Dialect)
	} else {
		fmt.Fprintf(&b, "; apply gormstore.MigrationSQL(%q, %q) with your migration tool", e.Dialect, e.Prefix)
	}
	b.WriteString(", or let Store.Migrate create them")
	return b.String()
}

// CheckSchema reports whether the database is ready for the store, without
// changing anything: on PostgreSQL, that the server is PostgreSQL 13 or
// newer (an error wrapping ErrPostgresVersion otherwise); on both dialects,
// that every table and index the migration files create exists, under the
// store's prefix (a *SchemaError naming each one missing otherwise). It
// checks names, not columns. bus.Start runs it instead of Migrate when
// outbox.Options.DisableAutoMigrate is set.
func (s *Store) CheckSchema(ctx context.Context) error {
	if err := s.checkVersion(ctx); err != nil {
		return err
	}
	files, err := readMigrations(s.dialect.name)
	if err != nil {
		return err
	}
	var objects []SchemaObject
	for _, f := range files {
		for _, stmt := range migration.Statements(migration.WithPrefix(f.Up, DefaultTablePrefix, s.prefix)) {
			if o, ok := migration.Created(stmt); ok {
				objects = append(objects, SchemaObject{Kind: o.Kind, Name: o.Name, File: path.Join("migrations", s.dialect.name, f.Name)})
			}
		}
	}
	names := make([]string, len(objects))
	for i, o := range objects {
		names[i] = o.Name
	}
	missing, err := s.missingObjects(ctx, s.db.WithContext(ctx), names)
	if err != nil {
		return fmt.Errorf("gormstore: %w", err)
	}
	if len(missing) == 0 {
		return nil
	}
	e := &SchemaError{Dialect: s.dialect.name, Prefix: s.prefix}
	for _, o := range objects {
		if missing[o.Name] {
			e.Missing = append(e.Missing, o)
		}
	}
	return e
}

// checkVersion returns an error on a PostgreSQL server older than 13.
func (s *Store) checkVersion(ctx context.Context) error {
	if s.dialect.name != DialectPostgres {
		return nil
	}
	num, err := s.versionNum(ctx)
	if err != nil {
		return fmt.Errorf("gormstore: read the server version: %w", err)
	}
	if num < MinPostgresVersionNum {
		return fmt.Errorf("gormstore: %w: the server is PostgreSQL %s (server_version_num %d); the outbox needs pg_current_xact_id and pg_xact_status, which came with 13",
			ErrPostgresVersion, versionString(num), num)
	}
	return nil
}

func (s *Store) queryVersionNum(ctx context.Context) (int, error) {
	var num int
	err := s.db.WithContext(ctx).Raw("SELECT CAST(current_setting('server_version_num') AS integer)").Scan(&num).Error
	return num, err
}

// versionString formats a server_version_num: 130004 is 13.4, 90624 9.6.24.
func versionString(num int) string {
	if num >= 100000 {
		return fmt.Sprintf("%d.%d", num/10000, num%10000)
	}
	return fmt.Sprintf("%d.%d.%d", num/10000, num/100%100, num%100)
}

// missingObjects returns which of names (tables and indexes, resolved like
// the script's unqualified names) do not exist. It takes no lock on the
// tables.
func (s *Store) missingObjects(ctx context.Context, db *gorm.DB, names []string) (map[string]bool, error) {
	missing := map[string]bool{}
	var relations, columns []string
	for _, n := range names {
		if strings.Contains(n, ".") { // "<table>.<column>" (migration.Created)
			columns = append(columns, n)
		} else {
			relations = append(relations, n)
		}
	}
	if len(relations) > 0 {
		if err := s.missingRelations(ctx, db, relations, missing); err != nil {
			return nil, err
		}
	}
	for _, c := range columns {
		table, column, _ := strings.Cut(c, ".")
		var n int64
		q := "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(?) AND attname = ? AND NOT attisdropped"
		if s.dialect.name != DialectPostgres {
			q = "SELECT count(*) FROM pragma_table_info(?) WHERE name = ?"
		}
		if err := db.WithContext(ctx).Raw(q, table, column).Scan(&n).Error; err != nil {
			return nil, fmt.Errorf("check the schema: %w", err)
		}
		if n == 0 {
			missing[c] = true
		}
	}
	return missing, nil
}

func (s *Store) missingRelations(ctx context.Context, db *gorm.DB, names []string, missing map[string]bool) error {
	if s.dialect.name == DialectPostgres {
		// The names are validated identifiers (validatePrefix), so a plain
		// array literal carries them.
		var absent []string
		err := db.WithContext(ctx).Raw("SELECT n FROM unnest(CAST(CAST(? AS text) AS text[])) AS n WHERE to_regclass(n) IS NULL",
			"{"+strings.Join(names, ",")+"}").Scan(&absent).Error
		if err != nil {
			return fmt.Errorf("check the schema: %w", err)
		}
		for _, n := range absent {
			missing[n] = true
		}
		return nil
	}
	var present []string
	if err := db.WithContext(ctx).Raw("SELECT name FROM sqlite_master WHERE type IN ('table', 'index') AND name IN ?", names).Scan(&present).Error; err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	for _, n := range names {
		missing[n] = true
	}
	for _, n := range present {
		delete(missing, n)
	}
	return nil
}
