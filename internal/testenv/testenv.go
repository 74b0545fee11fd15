package testenv

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io/fs"
	"os"
	"sort"
	"strings"
	"testing"
)

// Environment variables read by integration tests.
const (
	PostgresVar = "BAREWIRE_TEST_POSTGRES_DSN"
	AMQPVar     = "BAREWIRE_TEST_AMQP_URL"
	// AMQPClusterVar lists the AMQP URLs of a RabbitMQ cluster's nodes,
	// comma-separated, in node order (node 1 first), as
	// `scripts/rabbitmq-cluster.sh urls` prints them. Tests stop and start
	// those nodes with that script.
	AMQPClusterVar = "BAREWIRE_TEST_AMQP_CLUSTER_URLS"
	NATSVar        = "BAREWIRE_TEST_NATS_URL"
	RedisVar       = "BAREWIRE_TEST_REDIS_ADDR"
)

// PostgresDSN returns the test PostgreSQL DSN or skips (fails under CI).
func PostgresDSN(t testing.TB) string {
	return get(t, PostgresVar, "host=127.0.0.1 user=postgres dbname=test sslmode=disable")
}

// AMQPURL returns the test RabbitMQ URL or skips (fails under CI).
func AMQPURL(t testing.TB) string { return get(t, AMQPVar, "amqp://guest:guest@127.0.0.1:5672/") }

// AMQPClusterURLs returns the URLs of the test cluster's nodes, in node
// order, or skips (fails under CI).
func AMQPClusterURLs(t testing.TB) []string {
	raw := get(t, AMQPClusterVar, "amqp://guest:guest@127.0.0.1:5681/,amqp://guest:guest@127.0.0.1:5682/,amqp://guest:guest@127.0.0.1:5683/")
	var urls []string
	for _, u := range strings.Split(raw, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}

// NATSURL returns the test NATS server's URL (with JetStream) or skips
// (fails under CI).
func NATSURL(t testing.TB) string { return get(t, NATSVar, "nats://127.0.0.1:4222") }

// RedisAddr returns the test Redis server's address or skips (fails under
// CI).
func RedisAddr(t testing.TB) string { return get(t, RedisVar, "127.0.0.1:6379") }

func get(t testing.TB, name, example string) string {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		return v
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set, and integration tests must not skip under CI", name)
	}
	t.Skipf("integration test: set %s (e.g. %q) to run it", name, example)
	return ""
}

// PostgresSchema creates a schema of the test's own on db, dropped with
// everything in it when the test ends, and returns its name and dsn with
// it as the search_path: tables created through a pool opened on that DSN
// may then keep their default names without meeting other tests' tables.
// Open such pools after calling PostgresSchema, so that they are closed
// before the schema is dropped.
func PostgresSchema(t testing.TB, db *sql.DB, dsn string) (schema, schemaDSN string) {
	t.Helper()
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	schema = "bwt_" + hex.EncodeToString(b)
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return schema, dsn + sep + "search_path=" + schema
	}
	return schema, dsn + " search_path=" + schema
}

// ApplyMigrationFiles runs every *.sql file at the root of fsys, in name
// order, each as it is in one statement batch of its own transaction: what
// a migration tool that runs plain SQL files does (psql -f, Atlas). It uses
// none of the framework's own migration code.
func ApplyMigrationFiles(t testing.TB, db *sql.DB, fsys fs.FS) {
	t.Helper()
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no migration files")
	}
	sort.Strings(names)
	for _, name := range names {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(string(data)); err != nil {
			_ = tx.Rollback()
			t.Fatalf("apply %s: %v", name, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("apply %s: %v", name, err)
		}
	}
}

// PostgresCatalog describes every table, column, constraint, index and
// sequence in schema, one sorted line each, with prefix written as
// defaultPrefix and the schema's name removed: two schemas made by the same
// DDL under different prefixes have equal catalogs.
func PostgresCatalog(t testing.TB, db *sql.DB, schema, prefix, defaultPrefix string) []string {
	t.Helper()
	var lines []string
	for _, q := range []string{
		`SELECT table_name, column_name, ordinal_position::text, data_type, is_nullable, column_default, is_identity, identity_generation, character_maximum_length::text
			FROM information_schema.columns WHERE table_schema = $1`,
		`SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1`,
		`SELECT conrelid::regclass::text AS tbl, conname, contype::text, pg_get_constraintdef(oid) AS def
			FROM pg_constraint WHERE connamespace = $1::regnamespace`,
		`SELECT relname, relkind::text, array_to_string(reloptions, ',') AS options, relpersistence::text
			FROM pg_class WHERE relnamespace = $1::regnamespace`,
	} {
		for _, l := range QueryLines(t, db, q, schema) {
			l = strings.ReplaceAll(l, schema+".", "")
			lines = append(lines, strings.ReplaceAll(l, prefix, defaultPrefix))
		}
	}
	sort.Strings(lines)
	return lines
}

// QueryLines runs query and returns each row as one line, "column=value"
// pairs joined by " | ", with runs of white space made single spaces.
func QueryLines(t testing.TB, db *sql.DB, query string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(cols))
		for i, v := range vals {
			parts[i] = cols[i] + "=" + strings.Join(strings.Fields(v.String), " ")
		}
		lines = append(lines, strings.Join(parts, " | "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}
