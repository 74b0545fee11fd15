package gormstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// Compile-time proof that the stores satisfy the framework's interfaces.
var (
	_ inbox.Store     = (*Inbox)(nil)
	_ outbox.Store    = (*Outbox)(nil)
	_ outbox.Notifier = (*Outbox)(nil)
)

// DefaultTablePrefix is the table prefix used unless WithTablePrefix says
// otherwise: the tables are barewire_inbox and barewire_outbox.
const DefaultTablePrefix = "barewire_"

// Dialect names, as reported by gorm.Dialector.Name and accepted by
// MigrationSQL.
const (
	DialectPostgres = "postgres"
	DialectSQLite   = "sqlite"
)

// identifierPattern is what every generated table and index name must match:
// a plain SQL identifier that PostgreSQL does not truncate (63 bytes).
var identifierPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// identifierSuffixes are the names the migrations append to the prefix;
// every one of them must form a valid identifier.
var identifierSuffixes = []string{
	"inbox", "inbox_processed_idx", "inbox_expires_idx", "inbox_received_idx",
	"outbox", "outbox_due_idx", "outbox_message_idx", "outbox_delivered_idx", "outbox_parked_idx",
}

// Option configures New.
type Option func(*config)

type config struct {
	prefix string
	now    func() time.Time // WithClock
}

// WithTablePrefix sets the prefix of the table and index names (default
// "barewire_"). Use it to run several independent buses in one schema. The
// prefix must make valid unquoted identifiers: letters, digits and
// underscores, not starting with a digit, at most 43 characters.
func WithTablePrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// Store is the GORM-backed home of the inbox and the outbox. It is safe for
// concurrent use.
type Store struct {
	db      *gorm.DB
	dialect dialect
	prefix  string
	// versionNum reads PostgreSQL's server_version_num (a field so that
	// tests can pretend to be an older server).
	versionNum func(ctx context.Context) (int, error)

	inbox  *Inbox
	outbox *Outbox
}

// New returns a Store on db. It does no I/O: call Migrate (or apply
// Migrations or MigrationSQL with your own tool, and CheckSchema) before
// use. db's dialect must be
// PostgreSQL or SQLite.
func New(db *gorm.DB, opts ...Option) (*Store, error) {
	if db == nil || db.Config == nil || db.Dialector == nil {
		return nil, errors.New("gormstore: New needs an opened *gorm.DB")
	}
	cfg := config{prefix: DefaultTablePrefix}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := validatePrefix(cfg.prefix); err != nil {
		return nil, err
	}
	d, err := dialectFor(db.Dialector.Name())
	if err != nil {
		return nil, err
	}
	s := &Store{
		// A new session drops any conditions chained on the caller's db, so
		// that our statements start clean.
		db:      db.Session(&gorm.Session{NewDB: true}),
		dialect: d,
		prefix:  cfg.prefix,
	}
	s.versionNum = s.queryVersionNum
	if cfg.now != nil {
		if err := s.useClock(cfg.now); err != nil {
			return nil, err
		}
	}
	s.inbox = newInbox(s)
	s.outbox = newOutbox(s)
	return s, nil
}

// Inbox returns the inbox store.
func (s *Store) Inbox() *Inbox { return s.inbox }

// Outbox returns the outbox store.
func (s *Store) Outbox() *Outbox { return s.outbox }

// Close stops the store's background work: on PostgreSQL, the commit
// watcher that notifies other processes' relays after a transaction that
// added outbox rows commits (see Outbox.Add). It waits for it to stop and
// does not close the database. After Close the stores keep working, but
// commits are no longer notified: relays find the rows on their next poll.
// Close is idempotent. The watcher also stops by itself whenever it has no
// transaction left to watch (it drops one still open after a minute), so a
// Store that is never closed keeps no goroutine for long.
func (s *Store) Close() error {
	if s.outbox.watch != nil {
		s.outbox.watch.close()
	}
	return nil
}

// Dialect reports the database dialect, DialectPostgres or DialectSQLite.
func (s *Store) Dialect() string { return s.dialect.name }

// TablePrefix reports the table prefix in use.
func (s *Store) TablePrefix() string { return s.prefix }

// validatePrefix checks that every name made from prefix is a valid
// identifier. Table names are the only identifiers interpolated into SQL, so
// this check is what keeps the SQL safe.
func validatePrefix(prefix string) error {
	for _, suffix := range identifierSuffixes {
		name := prefix + suffix
		if !identifierPattern.MatchString(name) {
			return fmt.Errorf("gormstore: invalid table prefix %q: the name %q must match %s (letters, digits and underscores, not starting with a digit, at most 63 characters)",
				prefix, name, identifierPattern)
		}
	}
	if strings.HasPrefix(strings.ToLower(prefix), "sqlite_") {
		return fmt.Errorf("gormstore: invalid table prefix %q: names starting with sqlite_ are reserved by SQLite", prefix)
	}
	return nil
}

// advisoryKey maps a name to a PostgreSQL advisory lock key.
func advisoryKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// txKey is the context key of the transaction; unexported so that only
// WithTx can set it.
type txKey struct{}

// WithTx returns a copy of ctx carrying tx, the transaction Outbox.Add
// writes in. Inbox.Process does this for the handler it runs.
func WithTx(ctx context.Context, tx *gorm.DB) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the transaction carried by ctx, if any. Handlers run
// by Inbox.Process use it for their own writes so that they commit together
// with the inbox mark.
func TxFromContext(ctx context.Context) (*gorm.DB, bool) {
	tx, ok := ctx.Value(txKey{}).(*gorm.DB)
	return tx, ok && tx != nil
}

// dialect holds the SQL that differs between databases.
type dialect struct {
	name string
	// now is the database clock as an SQL expression, in the stored form.
	now string
	// shifted is the database clock moved by a duration given as the single
	// placeholder; shift formats the duration for it.
	shifted string
}

func dialectFor(name string) (dialect, error) {
	switch name {
	case DialectPostgres:
		return dialect{
			name: DialectPostgres,
			// now() is the transaction's start: the store's own
			// transactions are short, and a single value keeps every
			// comparison in one statement consistent.
			now:     "now()",
			shifted: "(now() + make_interval(secs => ?))",
		}, nil
	case DialectSQLite:
		// 'now' is stable within one statement; %f gives milliseconds, which
		// short lock timeouts need (datetime() would round to seconds).
		return dialect{
			name:    DialectSQLite,
			now:     "strftime('%Y-%m-%d %H:%M:%f', 'now')",
			shifted: "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)",
		}, nil
	}
	return dialect{}, fmt.Errorf("gormstore: unsupported database dialect %q: supported are %q and %q", name, DialectPostgres, DialectSQLite)
}

// shift formats d as the argument of the dialect's shifted expression.
func (d dialect) shift(dur time.Duration) any {
	if d.name == DialectSQLite {
		// An SQLite date modifier such as '+0.300 seconds'.
		return fmt.Sprintf("%+.3f seconds", dur.Seconds())
	}
	return dur.Seconds()
}

// query expands the placeholders {inbox}, {outbox}, {now} and {now+?} in a
// query template. It runs once per query at construction.
func (s *Store) query(tmpl string) string {
	return strings.NewReplacer(
		"{inbox}", s.prefix+"inbox",
		"{outbox}", s.prefix+"outbox",
		"{now+?}", s.dialect.shifted,
		"{now}", s.dialect.now,
	).Replace(tmpl)
}

// chunk splits ids so that no statement exceeds the databases' bind
// parameter limits (SQLite 32766, PostgreSQL 65535).
func chunk[T any](items []T, size int) [][]T {
	var out [][]T
	for len(items) > size {
		out = append(out, items[:size])
		items = items[size:]
	}
	if len(items) > 0 {
		out = append(out, items)
	}
	return out
}
