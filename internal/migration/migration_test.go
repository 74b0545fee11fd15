package migration_test

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/barewire-go/barewire/internal/migration"
)

func TestRead(t *testing.T) {
	fsys := fstest.MapFS{
		"002_more.sql": {Data: []byte("-- header\n-- +goose Up\nCREATE INDEX IF NOT EXISTS p_t_idx ON p_t (a);\n")},
		"001_init.sql": {Data: []byte("-- header with p_ in it\n\n-- +goose Up\n-- a table\nCREATE TABLE IF NOT EXISTS p_t (\n    a text -- no ; here\n);\n")},
		"README.md":    {Data: []byte("not a migration")},
	}
	files, err := migration.Read(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0].Name != "001_init.sql" || files[1].Name != "002_more.sql" {
		t.Fatalf("files = %+v, want 001 then 002", files)
	}
	script := migration.Script(files, "p_", "acme_")
	if !strings.HasPrefix(script, migration.UpAnnotation+"\n") || strings.Count(script, migration.UpAnnotation) != 1 {
		t.Errorf("the script does not start with its single Up annotation:\n%s", script)
	}
	if strings.Contains(script, "header") || strings.Contains(script, "p_t") {
		t.Errorf("the script keeps a header or the default prefix:\n%s", script)
	}
	stmts := migration.Statements(script)
	want := []string{"CREATE TABLE IF NOT EXISTS acme_t (\n    a text -- no ; here\n);", "CREATE INDEX IF NOT EXISTS acme_t_idx ON acme_t (a);"}
	if !slices.Equal(stmts, want) {
		t.Errorf("statements = %q\nwant %q", stmts, want)
	}
	var objects []migration.Object
	for _, s := range stmts {
		if o, ok := migration.Created(s); ok {
			objects = append(objects, o)
		}
	}
	if !slices.Equal(objects, []migration.Object{{Kind: "table", Name: "acme_t"}, {Kind: "index", Name: "acme_t_idx"}}) {
		t.Errorf("objects = %+v", objects)
	}
	for stmt, want := range map[string]migration.Object{
		"ALTER TABLE acme_t ADD COLUMN b text;":               {Kind: "column", Name: "acme_t.b"},
		"ALTER TABLE acme_t ADD COLUMN IF NOT EXISTS b text;": {Kind: "column", Name: "acme_t.b"},
	} {
		if o, ok := migration.Created(stmt); !ok || o != want {
			t.Errorf("Created(%q) = %+v, %v; want %+v", stmt, o, ok, want)
		}
	}
	for _, stmt := range []string{"ALTER TABLE acme_t DROP COLUMN b;", "ALTER TABLE acme_t ADD CONSTRAINT c CHECK (a <> '');"} {
		if _, ok := migration.Created(stmt); ok {
			t.Errorf("Created accepted %q", stmt)
		}
	}
}

func TestReadRefusesMisshapenFiles(t *testing.T) {
	for name, text := range map[string]string{
		"no Up":       "CREATE TABLE IF NOT EXISTS t (a text);\n",
		"two Ups":     "-- +goose Up\nSELECT 1;\n-- +goose Up\nSELECT 2;\n",
		"Down before": "-- +goose Down\n-- +goose Up\nSELECT 1;\n",
	} {
		if _, err := migration.Read(fstest.MapFS{"001_x.sql": {Data: []byte(text)}}); err == nil {
			t.Errorf("%s: Read accepted it", name)
		}
	}
	// A Down section ends the Up one.
	files, err := migration.Read(fstest.MapFS{"001_x.sql": {Data: []byte("-- +goose Up\nSELECT 1;\n-- +goose Down\nDROP TABLE t;\n")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := migration.Statements(files[0].Up); !slices.Equal(got, []string{"SELECT 1;"}) {
		t.Errorf("Up statements = %q", got)
	}
}
