package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

const usage = `barewire inspects and maintains BareWire's inbox and outbox tables.

Usage:
  barewire migrate [--print [--dialect postgres|sqlite]]
  barewire stats
  barewire inbox ls [--message-id ID] [--consumer-type NAME] [--processed true|false] [--limit N] [--offset N]
  barewire inbox show MESSAGE-ID [--consumer-type NAME]
  barewire inbox release MESSAGE-ID --consumer-type NAME
  barewire inbox purge [--older-than 7d] [--batch N] [--dry-run] [--include-pending --yes]
  barewire outbox ls [--status pending|parked|delivered] [--scheduled] [--after-id ID] [--limit N]
  barewire outbox requeue (ID... | --all-parked)
  barewire outbox purge [--older-than 7d] [--batch N] [--dry-run] [--include-pending --yes]
  barewire saga states --table TABLE
  barewire saga ls --table TABLE [--state STATE] [--limit N]
  barewire saga show --table TABLE CORRELATION-ID
  barewire version

Flags every command takes:
  --dsn DSN      database: postgres://..., "host=... dbname=...", sqlite:PATH or PATH.db
                 (default $BAREWIRE_DSN)
  --prefix P     table prefix (default "barewire_")
  --json         JSON on stdout instead of tables

purge deletes processed inbox entries / delivered outbox rows older than
--older-than (default 7d, the default retention), in batches of --batch
rows, showing progress on stderr. Unprocessed inbox entries and pending or
parked outbox rows are kept unless --include-pending is given together
with --yes.

saga reads a saga machine's instance table (read-only): states counts the
instances in each state, ls lists them least recently changed first (the
ones stuck longest), show prints one with its data columns.
`

// usageError is a mistake on the command line (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// cli is one invocation's settings and outputs.
type cli struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer

	dsn    string
	prefix string
	json   bool
}

// run executes the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &cli{ctx: ctx, stdout: stdout, stderr: stderr}
	err := c.dispatch(args)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "barewire: %s\nRun 'barewire help' for usage.\n", c.scrub(ue.msg))
		return exitUsage
	default:
		fmt.Fprintf(stderr, "barewire: %s\n", c.scrub(err.Error()))
		return exitError
	}
}

func (c *cli) dispatch(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, usage)
		return usagef("no command given")
	}
	cmd, rest := args[0], args[1:]
	// "barewire inbox --help", "barewire outbox requeue -h": the usage,
	// which lists every command with its flags.
	if len(rest) > 0 && isHelp(rest[0]) || len(rest) > 1 && isHelp(rest[1]) && (cmd == "inbox" || cmd == "outbox" || cmd == "saga") {
		fmt.Fprint(c.stdout, usage)
		return nil
	}
	switch cmd {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(c.stdout, usage)
		return nil
	case "version", "--version":
		fmt.Fprintln(c.stdout, version())
		return nil
	case "migrate":
		return c.migrate(rest)
	case "stats":
		return c.stats(rest)
	case "saga":
		if len(rest) == 0 {
			return usagef("saga needs a subcommand: states, ls or show")
		}
		switch rest[0] {
		case "states", "ls", "show":
			return c.saga(rest[0], rest[1:])
		}
		return usagef("unknown command %q", "saga "+rest[0])
	case "inbox", "outbox":
		if len(rest) == 0 {
			return usagef("%s needs a subcommand: %s", cmd, map[string]string{"inbox": "ls, show, release or purge", "outbox": "ls, requeue or purge"}[cmd])
		}
		sub, subArgs := rest[0], rest[1:]
		switch cmd + " " + sub {
		case "inbox ls":
			return c.inboxList(subArgs)
		case "inbox show":
			return c.inboxShow(subArgs)
		case "inbox release":
			return c.inboxRelease(subArgs)
		case "inbox purge":
			return c.purge(tableInbox, subArgs)
		case "outbox ls":
			return c.outboxList(subArgs)
		case "outbox requeue":
			return c.outboxRequeue(subArgs)
		case "outbox purge":
			return c.purge(tableOutbox, subArgs)
		}
		return usagef("unknown command %q", cmd+" "+sub)
	}
	return usagef("unknown command %q", cmd)
}

func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "--help", "-help":
		return true
	}
	return false
}

// version names the module version the binary was built from (a checkout
// builds "(devel)") and the commit when the build recorded it.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "barewire (no build information)"
	}
	v := "barewire " + bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			v += " " + s.Value
		}
	}
	return v + " " + bi.GoVersion
}

// flags returns a flag set with the flags every command takes.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("barewire "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	// The default is applied after parsing (useDSNEnv), so that -h never
	// prints a DSN with its password.
	fs.StringVar(&c.dsn, "dsn", "", "database DSN (postgres://..., host=..., sqlite:PATH or PATH.db); default $BAREWIRE_DSN")
	fs.StringVar(&c.prefix, "prefix", gormstore.DefaultTablePrefix, "table prefix")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of tables")
	return fs
}

// parse parses flags that may come before, between or after positional
// arguments, and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// ---- database ----

const (
	dialectPostgres = gormstore.DialectPostgres
	dialectSQLite   = gormstore.DialectSQLite
)

// dsnDialect tells the database from the DSN's form, and returns the
// SQLite path for SQLite.
func dsnDialect(dsn string) (dialect, path string, err error) {
	if dsn == "" {
		dsn = os.Getenv("BAREWIRE_DSN")
	}
	lower := strings.ToLower(dsn)
	switch {
	case dsn == "":
		return "", "", usagef("no database given: pass --dsn or set BAREWIRE_DSN (postgres://user:password@host/db, \"host=... dbname=...\", or sqlite:path)")
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return dialectPostgres, "", nil
	case strings.HasPrefix(lower, "sqlite:"):
		p := dsn[len("sqlite:"):]
		if p == "" {
			return "", "", usagef("--dsn sqlite: needs a file path, as in sqlite:/var/lib/app/bus.db")
		}
		return dialectSQLite, p, nil
	case strings.HasSuffix(lower, ".db"), strings.HasSuffix(lower, ".sqlite"), strings.HasSuffix(lower, ".sqlite3"):
		return dialectSQLite, dsn, nil
	case kvDSN.MatchString(dsn):
		return dialectPostgres, "", nil
	}
	return "", "", usagef("cannot tell the database from --dsn %q: use postgres://..., \"host=... dbname=...\", sqlite:PATH or a path ending in .db", redactDSN(dsn))
}

// kvDSN matches a key=value PostgreSQL DSN.
var kvDSN = regexp.MustCompile(`(^|\s)(host|hostaddr|dbname|user|port|sslmode|service)\s*=`)

// open opens the database and the store. create allows a missing SQLite
// file to be created (migrate).
func (c *cli) open(create bool) (*gorm.DB, *gormstore.Store, error) {
	if c.dsn == "" {
		c.dsn = os.Getenv("BAREWIRE_DSN")
	}
	dialect, path, err := dsnDialect(c.dsn)
	if err != nil {
		return nil, nil, err
	}
	var db *gorm.DB
	if dialect == dialectSQLite {
		if !create {
			if _, err := os.Stat(path); err != nil {
				return nil, nil, fmt.Errorf("SQLite database %s: %w (run 'barewire migrate' to create it)", path, err)
			}
		}
		db, err = gormstore.OpenSQLite(path)
	} else {
		db, err = postgresdb.Open(c.dsn)
	}
	if err != nil {
		return nil, nil, err
	}
	store, err := gormstore.New(db, gormstore.WithTablePrefix(c.prefix))
	if err != nil {
		closeDB(db)
		return nil, nil, err
	}
	return db, store, nil
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// ---- secrets ----

var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// redactDSN hides the password of a DSN.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
		return dsn
	}
	return kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
}

// dsnPassword returns the DSN's password, "" when it has none.
func dsnPassword(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		p, _ := u.User.Password()
		return p
	}
	if m := kvPassword.FindStringSubmatch(dsn); m != nil {
		p := m[2]
		if len(p) >= 2 && p[0] == '\'' && p[len(p)-1] == '\'' {
			p = strings.NewReplacer(`\\`, `\`, `\'`, `'`).Replace(p[1 : len(p)-1])
		}
		return p
	}
	return ""
}

// scrub removes the DSN and its password from text about to be printed.
func (c *cli) scrub(s string) string {
	if c.dsn == "" {
		return s
	}
	s = strings.ReplaceAll(s, c.dsn, redactDSN(c.dsn))
	if p := dsnPassword(c.dsn); len(p) >= 3 {
		s = strings.ReplaceAll(s, p, "xxxxx")
		if esc := url.QueryEscape(p); esc != p {
			s = strings.ReplaceAll(s, esc, "xxxxx")
		}
	}
	return s
}

// ---- output ----

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes rows aligned in columns.
func (c *cli) table(header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return fmtTime(*t)
}

// fmtAge prints a duration rounded for people.
func fmtAge(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", d.Hours()/24), ".0") + "d"
}

func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// parseAge parses a duration, also in days ("7d", "1.5d").
func parseAge(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		f, err := strconv.ParseFloat(d, 64)
		if err != nil || f < 0 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(f * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("invalid duration %q (use 90m, 36h or 7d)", s)
	}
	return d, nil
}
