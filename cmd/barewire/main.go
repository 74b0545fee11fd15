// Command barewire inspects and maintains BareWire's inbox and outbox
// tables from the command line: create or upgrade them, list and show
// entries, requeue parked outbox rows, purge old rows in bounded batches,
// and print counts.
//
//	barewire migrate                      create or upgrade the tables
//	barewire migrate --print              print the SQL instead (for your own migration tool)
//	barewire stats                        outbox and inbox counts
//	barewire inbox ls|show|release|purge  inbox entries; release drops a stuck lock
//	barewire outbox ls|requeue|purge      outbox rows
//	barewire saga states|ls|show          saga instances (read-only), by state or correlation id
//
// Every command takes --dsn (or BAREWIRE_DSN), --prefix (table prefix,
// default "barewire_") and --json (machine-readable output on stdout).
// A DSN starting with postgres:// or postgresql://, or written as
// key=value pairs ("host=... user=... dbname=..."), opens PostgreSQL;
// "sqlite:path" or a path ending in .db opens that SQLite file. The DSN's
// password is never printed.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
