// Package workload is what the reliability test service
// (cmd/barewire-testsvc) and the reliability harness (package reliability)
// agree on: the names of a run's queues, message types and tables, the
// messages, and the business tables the checker reads.
//
// Every name is derived from two values: the run id, which namespaces the
// broker objects (queues, exchanges, message types), and the table prefix,
// which namespaces the database tables (the bus's inbox and outbox and the
// business tables below). Several runs can share one broker and one database.
//
// The business tables deliberately have no unique constraint on the effect
// key: a doubled effect must show up as two rows for the checker to count,
// not as a constraint error that would hide it behind a retry.
package workload

import (
	"context"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/transport/pgtransport"
)

// Business table suffixes, appended to the table prefix.
const (
	// TableProduced holds one row per committed producer transaction:
	// written in the same transaction as the outbox row (publish iff commit).
	TableProduced = "produced"
	// TableRolledBack holds the ids of producer transactions that were
	// deliberately rolled back (written after the rollback, outside it).
	TableRolledBack = "rolled_back"
	// TableRepublished holds one row per committed re-publish of an already
	// committed id (same message-id, new transaction).
	TableRepublished = "republished"
	// TableEffects holds one row per (message, endpoint) business effect,
	// written through the consumer's transaction.
	TableEffects = "effects"
	// TableFollowups holds one row per follow-up message consumed by the
	// audit endpoint.
	TableFollowups = "followups"
	// TablePoison holds one row per poison message the producer sent or
	// tried to send (the poison profile, see PoisonClasses): its class, its
	// id (hex, since a bad id may not be storable as text), and whether
	// the publish was refused.
	TablePoison = "poison"
)

// Tables lists every business table suffix.
var Tables = []string{TableProduced, TableRolledBack, TableRepublished, TableEffects, TableFollowups, TablePoison}

var (
	runRE        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$`)
	identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
)

// Names derives every broker and database name of one run.
type Names struct {
	// Run namespaces queues, exchanges and message types.
	Run string
	// Prefix namespaces tables: the bus's <prefix>inbox and <prefix>outbox
	// and the business tables.
	Prefix string
}

// Validate checks that the run id makes valid endpoint names and that the
// prefix makes valid table names (the same rule gormstore applies; table
// names are interpolated into SQL, so this check is what keeps it safe).
func (n Names) Validate() error {
	if !runRE.MatchString(n.Run) {
		return fmt.Errorf("workload: invalid run id %q: use 1-48 letters, digits, '_' or '-', starting with a letter or digit", n.Run)
	}
	if err := gormstore.ValidatePrefix(n.Prefix); err != nil {
		return err
	}
	for _, t := range Tables {
		if !identifierRE.MatchString(n.Prefix + t) {
			return fmt.Errorf("workload: invalid table prefix %q: %q is not a plain SQL identifier", n.Prefix, n.Prefix+t)
		}
	}
	return nil
}

// OrderType is the message type the producers publish.
func (n Names) OrderType() string { return n.Run + ".OrderPlaced" }

// FollowupType is the message type the order consumers publish.
func (n Names) FollowupType() string { return n.Run + ".FollowupIssued" }

// Ledger is the first endpoint consuming orders.
func (n Names) Ledger() string { return n.Run + "-ledger" }

// Notify is the second endpoint consuming orders.
func (n Names) Notify() string { return n.Run + "-notify" }

// Audit is the endpoint consuming follow-ups.
func (n Names) Audit() string { return n.Run + "-audit" }

// OrderEndpoints are the endpoints that consume OrderType.
func (n Names) OrderEndpoints() []string { return []string{n.Ledger(), n.Notify()} }

// Queues lists every endpoint queue of the run (error queues are these
// names with "_error" appended).
func (n Names) Queues() []string { return []string{n.Ledger(), n.Notify(), n.Audit()} }

// Exchanges lists the exchanges the run's topology declares.
func (n Names) Exchanges() []string { return []string{n.OrderType(), n.FollowupType()} }

// Table returns the full name of a business table (a suffix from Tables,
// or "inbox" / "outbox").
func (n Names) Table(suffix string) string { return n.Prefix + suffix }

// Order is what producers publish.
type Order struct {
	ID       string `json:"id"`
	Seq      int64  `json:"seq"`
	Producer string `json:"producer"`
	// Pad makes the body as large as the profile asks.
	Pad string `json:"pad,omitempty"`
}

// Followup is what each order consumer publishes through its outbox.
type Followup struct {
	OriginID       string `json:"originId"`
	SourceEndpoint string `json:"sourceEndpoint"`
}

// Migrate creates the business tables if they do not exist. Several
// processes may call it at once: they serialize on an advisory lock.
func Migrate(ctx context.Context, db *gorm.DB, n Names) error {
	if err := n.Validate(); err != nil {
		return err
	}
	t := n.Table
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + t(TableProduced) + ` (
			message_id text PRIMARY KEY,
			producer   text NOT NULL,
			phase      text NOT NULL DEFAULT '',
			created_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE TABLE IF NOT EXISTS ` + t(TableRolledBack) + ` (
			message_id text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE TABLE IF NOT EXISTS ` + t(TableRepublished) + ` (
			message_id text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		// No unique constraint, on purpose (see the package comment).
		`CREATE TABLE IF NOT EXISTS ` + t(TableEffects) + ` (
			message_id text NOT NULL,
			endpoint   text NOT NULL,
			instance   text NOT NULL,
			attempt    integer NOT NULL,
			created_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE INDEX IF NOT EXISTS ` + t(TableEffects) + `_key_idx ON ` + t(TableEffects) + ` (message_id, endpoint)`,
		`CREATE TABLE IF NOT EXISTS ` + t(TableFollowups) + ` (
			followup_id     text NOT NULL,
			origin_id       text NOT NULL,
			source_endpoint text NOT NULL,
			instance        text NOT NULL,
			created_at      timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE INDEX IF NOT EXISTS ` + t(TableFollowups) + `_key_idx ON ` + t(TableFollowups) + ` (origin_id, source_endpoint)`,
		// message_id is the id as text when PostgreSQL can store it (NULL
		// otherwise); id_hex is always the exact bytes. outcome is
		// "sent" (the publish call succeeded) or "refused" (it returned
		// error, recorded here).
		`CREATE TABLE IF NOT EXISTS ` + t(TablePoison) + ` (
			poison_key text PRIMARY KEY,
			class      text NOT NULL,
			message_id text,
			id_hex     text NOT NULL,
			endpoints  integer NOT NULL,
			outcome    text NOT NULL,
			error      text NOT NULL DEFAULT '',
			created_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", advisoryKey("barewire:workload:"+n.Prefix)).Error; err != nil {
			return err
		}
		for _, s := range stmts {
			if err := tx.Exec(s).Error; err != nil {
				return fmt.Errorf("workload: migrate: %w", err)
			}
		}
		return nil
	})
}

// Drop removes the business tables and the bus's inbox and outbox tables of
// the run.
func Drop(ctx context.Context, db *gorm.DB, n Names) error {
	if err := n.Validate(); err != nil {
		return err
	}
	for _, s := range append(append([]string{}, Tables...), "inbox", "outbox") {
		if err := db.WithContext(ctx).Exec(`DROP TABLE IF EXISTS ` + n.Table(s)).Error; err != nil {
			return fmt.Errorf("workload: drop %s: %w", n.Table(s), err)
		}
	}
	return nil
}

// FailsFirstAttempt reports whether the service injects a failure into the
// first attempt of message id on endpoint, for a failure ratio in [0, 1].
// The decision is a pure function of its inputs, so a redelivery of the
// same message to the same endpoint is treated the same way.
func FailsFirstAttempt(id, endpoint string, ratio float64) bool {
	if ratio <= 0 {
		return false
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(endpoint))
	return float64(h.Sum64()%1_000_000) < ratio*1_000_000
}

func advisoryKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// TransportPrefix is the table prefix of the PostgreSQL transport's tables
// in a run on that transport: <prefix>queue_messages, <prefix>queues and
// <prefix>bindings, beside the run's other tables.
func (n Names) TransportPrefix() string { return n.Prefix }

// TransportTables lists the PostgreSQL transport's tables of the run.
func (n Names) TransportTables() []string {
	p := n.TransportPrefix()
	return []string{p + "queue_messages", p + "queues", p + "bindings"}
}

// MigrateTransport creates the PostgreSQL transport's tables of the run if
// they do not exist (pgtransport.MigrationSQL), serialized like Migrate.
// The processes build their buses with DisableAutoMigrate: the transport's
// own migration takes a SHARE lock on the live queue table (CREATE INDEX
// IF NOT EXISTS), which a frozen consumer's open transaction would turn
// into a stall of every writer.
func MigrateTransport(ctx context.Context, db *gorm.DB, n Names) error {
	if err := n.Validate(); err != nil {
		return err
	}
	ddl, err := pgtransport.MigrationSQL(n.TransportPrefix())
	if err != nil {
		return err
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", advisoryKey("barewire:workload:transport:"+n.Prefix)).Error; err != nil {
			return err
		}
		for s := range strings.SplitSeq(ddl, ";\n") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			if err := tx.Exec(s).Error; err != nil {
				return fmt.Errorf("workload: migrate the transport's tables: %w", err)
			}
		}
		return nil
	})
}

// DropTransport removes the PostgreSQL transport's tables of the run.
func DropTransport(ctx context.Context, db *gorm.DB, n Names) error {
	if err := n.Validate(); err != nil {
		return err
	}
	for _, t := range n.TransportTables() {
		if err := db.WithContext(ctx).Exec(`DROP TABLE IF EXISTS ` + t).Error; err != nil {
			return fmt.Errorf("workload: drop %s: %w", t, err)
		}
	}
	return nil
}

// ApplicationNameMax is PostgreSQL's limit on application_name (longer
// names are truncated by the server).
const ApplicationNameMax = 63

// ApplicationName is the application_name a test service process sets on
// its database connections: the harness finds the process's sessions in
// pg_stat_activity by it (the db-close fault). pid is the process's OS pid.
// It is cut to ApplicationNameMax bytes so that what the server reports is
// exactly this string.
func ApplicationName(run, instance string, pid int) string {
	s := fmt.Sprintf("bwtestsvc %s %s pid %d", run, instance, pid)
	if len(s) > ApplicationNameMax {
		s = s[:ApplicationNameMax]
	}
	return s
}
