// Package migration reads the SQL migration files that gormstore and the
// PostgreSQL transport embed, and turns them into the scripts their
// Migrate functions run.
//
// A migration file is a goose migration and a plain SQL script at once:
// header comments, the line "-- +goose Up", then statements, each ending
// with ';' at the end of a line and holding no other ';' (no goose
// StatementBegin blocks), and no Down section. goose runs what follows the
// annotation; Atlas, psql and every tool that runs a file as it is read the
// annotation as a comment. The files spell the default table prefix, and
// every occurrence of it in a statement is a table or index name.
package migration

import (
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
)

// Goose's annotations.
const (
	UpAnnotation   = "-- +goose Up"
	DownAnnotation = "-- +goose Down"
)

// File is one migration file.
type File struct {
	Name string // e.g. 001_init.sql
	Up   string // the text after the Up annotation
}

// Read returns the *.sql files at the root of fsys, in name order (the
// files are numbered).
func Read(fsys fs.FS) ([]File, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".sql") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	files := make([]File, 0, len(names))
	for _, name := range names {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		up, err := upSection(string(data))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		files = append(files, File{Name: name, Up: up})
	}
	return files, nil
}

// upSection returns what follows the Up annotation (up to a Down
// annotation, which the files do not have).
func upSection(text string) (string, error) {
	var b strings.Builder
	in := false
	for line := range strings.Lines(text) {
		switch strings.TrimRight(line, " \t\r\n") {
		case UpAnnotation:
			if in {
				return "", fmt.Errorf("a second %q line", UpAnnotation)
			}
			in = true
			continue
		case DownAnnotation:
			if !in {
				return "", fmt.Errorf("%q before %q", DownAnnotation, UpAnnotation)
			}
			return b.String(), nil
		}
		if in {
			b.WriteString(line)
		}
	}
	if !in {
		return "", fmt.Errorf("no %q line", UpAnnotation)
	}
	return b.String(), nil
}

// Script joins the Up sections of files into one script under a single Up
// annotation (so that it is itself a goose migration), each after a comment
// naming its file, with prefix in place of defaultPrefix.
func Script(files []File, defaultPrefix, prefix string) string {
	var b strings.Builder
	b.WriteString(UpAnnotation + "\n")
	for _, f := range files {
		fmt.Fprintf(&b, "\n-- %s\n", f.Name)
		b.WriteString(strings.TrimLeft(f.Up, "\n"))
		if !strings.HasSuffix(f.Up, "\n") {
			b.WriteByte('\n')
		}
	}
	return WithPrefix(b.String(), defaultPrefix, prefix)
}

// WithPrefix returns sql with prefix in place of defaultPrefix.
func WithPrefix(sql, defaultPrefix, prefix string) string {
	return strings.ReplaceAll(sql, defaultPrefix, prefix)
}

// Statements cuts a script into statements: comment lines are dropped and
// a line ending in ';' ends a statement, as goose splits them.
func Statements(script string) []string {
	var stmts []string
	var cur strings.Builder
	for line := range strings.Lines(script) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(strings.TrimRight(line, "\r\n"))
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			stmts = append(stmts, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if rest := strings.TrimSpace(cur.String()); rest != "" {
		stmts = append(stmts, rest)
	}
	return stmts
}

// Object is a table, an index or a column that a statement creates.
type Object struct {
	Kind string // "table", "index" or "column"
	Name string // for a column: "<table>.<column>"
}

// createPattern matches the statements whose effect the catalog can
// confirm: CREATE TABLE / CREATE [UNIQUE] INDEX ... IF NOT EXISTS name.
var createPattern = regexp.MustCompile(`(?is)^CREATE\s+(?:UNIQUE\s+)?(TABLE|INDEX)\s+IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)\b`)

// addColumnPattern matches ALTER TABLE t ADD COLUMN [IF NOT EXISTS] c
// (SQLite has no IF NOT EXISTS there: the runner skips the statement when
// the catalog has the column).
var addColumnPattern = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+([A-Za-z_][A-Za-z0-9_]*)\s+ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?([A-Za-z_][A-Za-z0-9_]*)\b`)

// Created reports the object that stmt creates, if it is a CREATE TABLE or
// CREATE INDEX ... IF NOT EXISTS, or an ALTER TABLE ... ADD COLUMN.
func Created(stmt string) (Object, bool) {
	if m := addColumnPattern.FindStringSubmatch(stmt); m != nil {
		return Object{Kind: "column", Name: m[1] + "." + m[2]}, true
	}
	m := createPattern.FindStringSubmatch(stmt)
	if m == nil {
		return Object{}, false
	}
	return Object{Kind: strings.ToLower(m[1]), Name: m[2]}, true
}
