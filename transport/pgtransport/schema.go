package pgtransport

import (
	"context"
	stdsql "database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/migration"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/transport"
)

// DefaultTablePrefix is the prefix of the transport's tables unless
// Config.TablePrefix says otherwise: barewire_queue_messages,
// barewire_queues and barewire_bindings.
const DefaultTablePrefix = "barewire_"

// identifier is what every table, index and channel name made from the
// prefix must match: a plain, unquoted SQL identifier that PostgreSQL does
// not truncate (63 bytes). These names are the only text ever spliced into
// SQL; every value is a bind parameter.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// tableSuffixes are appended to the prefix; each result must be an identifier.
var tableSuffixes = []string{"queue_messages", "queue_messages_queue_idx", "queues", "bindings", "bindings_queue_idx"}

// ValidatePrefix reports whether prefix makes valid table names.
func ValidatePrefix(prefix string) error {
	for _, s := range tableSuffixes {
		if name := prefix + s; !identifier.MatchString(name) {
			return fmt.Errorf("pgtransport: invalid table prefix %q: the name %q must match %s (letters, digits and underscores, not starting with a digit, at most 63 characters)",
				prefix, name, identifier)
		}
	}
	return nil
}

// names are the identifiers of one prefix. Unquoted identifiers fold to
// lower case in PostgreSQL, so the lower-case forms are the real names (and
// the NOTIFY channel, which is case-sensitive, uses them too).
type names struct {
	prefix                              string
	messages, queues, bindings, channel string
}

func namesFor(prefix string) names {
	p := strings.ToLower(prefix)
	return names{
		prefix:   p,
		messages: p + "queue_messages",
		queues:   p + "queues",
		bindings: p + "bindings",
		channel:  p + "queue_messages",
	}
}

// objects lists the names of every table and index the migrations create.
func (n names) objects() []string {
	var out []string
	for _, o := range n.schemaObjects() {
		out = append(out, o.Name)
	}
	return out
}

// schemaObject is a table or index and the migration file that creates it.
type schemaObject struct {
	migration.Object
	file string
}

// schemaObjects lists every table and index the migrations create.
func (n names) schemaObjects() []schemaObject {
	var out []schemaObject
	for _, f := range readMigrations() {
		for _, stmt := range migration.Statements(migration.WithPrefix(f.Up, DefaultTablePrefix, n.prefix)) {
			if o, ok := migration.Created(stmt); ok {
				out = append(out, schemaObject{o, "migrations/" + f.Name})
			}
		}
	}
	return out
}

func (n names) expand(tmpl string) string {
	return strings.NewReplacer("{messages}", n.messages, "{queues}", n.queues, "{bindings}", n.bindings).Replace(tmpl)
}

// migrationFiles are the transport's migrations. They spell
// DefaultTablePrefix; MigrationSQL substitutes the configured prefix.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the transport's migration files: a file system whose
// root holds 001_init.sql (and, in later releases, 002_... and so on), as
// they are in the module next to this package's source. They create the
// tables with the default prefix, barewire_; for another prefix use
// MigrationSQL.
//
// Each file is a goose migration and a plain SQL script at once: goose runs
// what follows its "-- +goose Up" line, and Atlas, psql or any tool that
// runs a file as it is reads that line as a comment. The files have no Down
// section (rolling back would drop the queued messages). Hand the file
// system to goose or copy the files into your migrations folder, renumbered
// to fit its sequence. Every statement is idempotent.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the directory is embedded
	}
	return sub
}

// MigrationSQL returns the SQL that creates the transport's tables for
// prefix: one "-- +goose Up" line, then the statements of the migration
// files (Migrations) in order, with prefix in place of barewire_. Every
// statement is idempotent. Start runs exactly these statements unless
// Config.DisableAutoMigrate is set; the script is for teams whose migration
// tool owns the schema (it is a goose migration as it is, and plain SQL to
// every other tool).
func MigrationSQL(prefix string) (string, error) {
	if err := ValidatePrefix(prefix); err != nil {
		return "", err
	}
	return migrationScript(namesFor(prefix)), nil
}

func readMigrations() []migration.File {
	files, err := migration.Read(Migrations())
	if err != nil {
		panic(fmt.Sprintf("pgtransport: embedded migrations: %v", err)) // every test reads them
	}
	return files
}

func migrationScript(n names) string {
	return migration.Script(readMigrations(), DefaultTablePrefix, n.prefix)
}

func migrationStatements(n names) []string {
	return migration.Statements(migrationScript(n))
}

// prepareSchema runs first in Start's transaction: it checks that the
// server is PostgreSQL 13 or newer, then creates the tables or, with
// DisableAutoMigrate, checks that they exist, so that a database the
// transport cannot use fails Start, not the first publish.
func (t *Transport) prepareSchema(ctx context.Context, tx *stdsql.Tx) error {
	if err := t.checkVersion(ctx, tx); err != nil {
		return err
	}
	if !t.cfg.DisableAutoMigrate {
		return t.migrate(ctx, tx)
	}
	return t.checkSchema(ctx, tx)
}

func (t *Transport) checkVersion(ctx context.Context, tx *stdsql.Tx) error {
	num := t.versionNum
	if num == 0 {
		if err := tx.QueryRowContext(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
			return fmt.Errorf("read the server version: %w", err)
		}
	}
	if num < gormstore.MinPostgresVersionNum {
		v := fmt.Sprintf("%d.%d", num/10000, num%10000)
		if num < 100000 {
			v = fmt.Sprintf("%d.%d.%d", num/10000, num/100%100, num%100)
		}
		return fmt.Errorf("%w: the server is PostgreSQL %s (server_version_num %d); the transport needs pg_current_xact_id and pg_xact_status, which came with 13",
			gormstore.ErrPostgresVersion, v, num)
	}
	return nil
}

// checkSchema returns an error naming every table and index that is
// missing, and where to get it.
func (t *Transport) checkSchema(ctx context.Context, tx *stdsql.Tx) error {
	objects := t.n.schemaObjects()
	names := make([]string, len(objects))
	for i, o := range objects {
		names[i] = o.Name
	}
	rows, err := tx.QueryContext(ctx, `SELECT n FROM unnest($1::text[]) AS n WHERE to_regclass(n) IS NULL`, names)
	if err != nil {
		return fmt.Errorf("check the tables: %w", err)
	}
	missing := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return fmt.Errorf("check the tables: %w", err)
		}
		missing[n] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check the tables: %w", err)
	}
	if len(missing) == 0 {
		return nil
	}
	var absent []schemaObject
	for _, o := range objects {
		if missing[o.Name] {
			absent = append(absent, o)
		}
	}
	var list []string
	for i, o := range absent {
		item := o.Kind + " " + o.Name
		if i == len(absent)-1 || absent[i+1].file != o.file {
			item += " (created by pgtransport's " + o.file + ")"
		}
		list = append(list, item)
	}
	apply := "the files of pgtransport.Migrations()"
	if t.n.prefix != DefaultTablePrefix {
		apply = fmt.Sprintf("pgtransport.MigrationSQL(%q)", t.n.prefix)
	}
	return fmt.Errorf("DisableAutoMigrate is set, and the database lacks %s; apply %s with your migration tool, or unset DisableAutoMigrate so that Start creates them",
		strings.Join(list, ", "), apply)
}

// schemaAdapter is the transport's watermill-sql SchemaAdapter. The
// watermill-sql Publisher inserts through it (InsertQuery routes every
// message to its queues in one statement and notifies listeners), and the
// transport's subscriber claims and decodes through it (SelectQuery,
// UnmarshalMessage).
//
// It differs from watermill-sql's PostgreSQLQueueSchema in what the
// pitfalls in docs/transports.md require: one table for every queue (a
// queue column instead of a table per topic, so queue names need not be
// identifiers), ids of any length (text, not VARCHAR(36)), bytea payloads,
// a bigint identity, and a claim that takes one row with FOR UPDATE SKIP
// LOCKED in READ COMMITTED and leases it (visible_at) instead of holding a
// transaction open while the handler runs.
type schemaAdapter struct {
	n     names
	lease time.Duration
	// inTx makes InsertQuery also return the inserting transaction's id
	// (DeliverTx: the caller's transaction), which the transport's commit
	// watcher follows to notify consumers once it commits. The transport
	// never NOTIFYs inside an inserting transaction: a transaction that
	// NOTIFYs holds a database-wide lock from pre-commit until its commit
	// is flushed, so notifying commits serialize and lose group commit (8
	// publishers: ~150 instead of ~900 inserts/s on the test machine).
	inTx      bool
	insertSQL string
	txSQL     string
	claimSQL  string
	// Per-message statements of the consumers, expanded once: the
	// delivery count ($2) fences each to the claim that made it.
	ackSQL     string // delete the row (asynchronous commit)
	ackTxSQL   string // delete the row in the caller's transaction (AckTx)
	moveSQL    string // make the row visible again after $3 seconds: nack, release, lease extension
	nextDueSQL string // seconds until the queue's next row turns visible
}

var _ wsql.SchemaAdapter = schemaAdapter{}

// insertCTE unnests a batch and fans each message out to the queues bound
// to its exchange (or to its declared queue), in batch order.
const insertCTE = `WITH m AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[])
        WITH ORDINALITY AS m(kind, name, message_id, metadata, payload, ord)
), ins AS (
    INSERT INTO {messages} (queue, message_id, metadata, payload, visible_at)
    SELECT t.queue, m.message_id, m.metadata::json, m.payload, now()
    FROM m CROSS JOIN LATERAL (
        SELECT b.queue FROM {bindings} b WHERE m.kind = 'exchange' AND b.exchange = m.name
        UNION ALL
        SELECT q.name FROM {queues} q WHERE m.kind = 'queue' AND q.name = m.name
    ) AS t(queue)
    ORDER BY m.ord, t.queue
    RETURNING 1
)
`

func newSchemaAdapter(n names, lease time.Duration) schemaAdapter {
	return schemaAdapter{
		n:     n,
		lease: lease,
		// One statement per batch. A data-modifying CTE runs to completion
		// whatever the outer query reads.
		insertSQL: n.expand(insertCTE + `SELECT count(*) FROM ins`),
		// The same in the caller's transaction (DeliverTx), also returning
		// that transaction's id for the commit watcher.
		txSQL: n.expand(insertCTE + `SELECT count(*), pg_current_xact_id()::text FROM ins`),
		// The row is locked only for this statement (SKIP LOCKED: a row
		// another consumer is claiming right now is passed over, never
		// waited for) and leased by moving visible_at: no transaction
		// stays open while the handler runs. There is no cursor or
		// snapshot bookkeeping, so a row committed late with a lower id,
		// or a transaction open elsewhere, never holds back the rows
		// behind it.
		ackSQL:     n.expand(`WITH ` + asyncCommit + ` DELETE FROM {messages} AS m USING cfg WHERE m.id = $1 AND m.deliveries = $2`),
		ackTxSQL:   n.expand(`DELETE FROM {messages} WHERE id = $1 AND deliveries = $2`),
		moveSQL:    n.expand(`WITH ` + asyncCommit + ` UPDATE {messages} AS m SET visible_at = now() + make_interval(secs => $3) FROM cfg WHERE m.id = $1 AND m.deliveries = $2`),
		nextDueSQL: n.expand(`SELECT extract(epoch FROM min(visible_at) - now())::float8 FROM {messages} WHERE queue = $1`),
		claimSQL: n.expand(`WITH ` + asyncCommit + `, c AS (
    SELECT id FROM {messages}
    WHERE queue = $1 AND visible_at <= now()
    ORDER BY id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE {messages} AS m
SET visible_at = now() + make_interval(secs => $2), deliveries = m.deliveries + 1
FROM c, cfg WHERE m.id = c.id
RETURNING m.id, m.message_id, m.payload, m.metadata, m.deliveries`),
	}
}

// forTx returns the adapter whose insert also returns the transaction id.
func (s schemaAdapter) forTx() schemaAdapter {
	s.inTx = true
	return s
}

// asyncCommit is a CTE (named cfg; the statement must join it) that
// commits the statement's implicit transaction without waiting for the WAL
// flush. It is used for the consumer's bookkeeping only: claims, lease
// extensions, acks and nacks. Losing one of those in a database crash
// means the message is delivered again (or sooner), which at-least-once
// delivery and the inbox already cover; it halves the flushes per message.
// Inserts, which carry the messages, always commit synchronously (or as
// the caller's transaction says).
const asyncCommit = `cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS v)`

// topic is the watermill topic the Publisher is given. Routing is per
// message (its BW-Destination), so the topic carries nothing; a constant
// keeps message types free of watermill-sql's topic-name character set.
const topic = "barewire"

// InsertQuery implements wsql.SchemaAdapter.
func (s schemaAdapter) InsertQuery(p wsql.InsertQueryParams) (wsql.Query, error) {
	n := len(p.Msgs)
	kinds := make([]string, n)
	dests := make([]string, n)
	ids := make([]string, n)
	metas := make([]string, n)
	payloads := make([][]byte, n)
	for i, msg := range p.Msgs {
		kind, name := wire.ParseDestination(msg.Metadata.Get(wire.HeaderDestination))
		if name == "" {
			return wsql.Query{}, fmt.Errorf("pgtransport: message %q has no destination", msg.UUID)
		}
		meta, err := json.Marshal(msg.Metadata)
		if err != nil {
			return wsql.Query{}, fmt.Errorf("pgtransport: encode headers of message %q: %w", msg.UUID, err)
		}
		kinds[i], dests[i], ids[i], metas[i] = kind, name, msg.UUID, string(meta)
		payloads[i] = msg.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	if s.inTx {
		return wsql.Query{Query: s.txSQL, Args: []any{kinds, dests, ids, metas, payloads}}, nil
	}
	return wsql.Query{Query: s.insertSQL, Args: []any{kinds, dests, ids, metas, payloads}}, nil
}

// SelectQuery implements wsql.SchemaAdapter: it claims the oldest visible
// row of the queue params.Topic and leases it.
func (s schemaAdapter) SelectQuery(p wsql.SelectQueryParams) (wsql.Query, error) {
	if p.ConsumerGroup != "" {
		return wsql.Query{}, errors.New("pgtransport: consumer groups are not supported; every endpoint has its own queue")
	}
	return wsql.Query{Query: s.claimSQL, Args: []any{p.Topic, s.lease.Seconds()}}, nil
}

// deliveriesKey is the Row.ExtraData key of the delivery count, which
// fences acks, nacks and lease extensions to the claim that made them.
const deliveriesKey = "deliveries"

// UnmarshalMessage implements wsql.SchemaAdapter.
func (s schemaAdapter) UnmarshalMessage(p wsql.UnmarshalMessageParams) (wsql.Row, error) {
	var (
		r          wsql.Row
		id         string
		deliveries int
	)
	if err := p.Row.Scan(&r.Offset, &id, &r.Payload, &r.Metadata, &deliveries); err != nil {
		return wsql.Row{}, fmt.Errorf("pgtransport: scan message row: %w", err)
	}
	r.UUID = []byte(id)
	if r.Payload == nil {
		r.Payload = []byte{}
	}
	msg := message.NewMessage(id, r.Payload)
	if len(r.Metadata) > 0 {
		if err := json.Unmarshal(r.Metadata, &msg.Metadata); err != nil {
			return wsql.Row{}, fmt.Errorf("pgtransport: message row %d: bad headers: %w", r.Offset, err)
		}
		if msg.Metadata == nil {
			msg.Metadata = message.Metadata{}
		}
	}
	msg.Metadata.Set(transport.MetaRedelivered, strconv.FormatBool(deliveries > 1))
	msg.Metadata.Set(transport.MetaDeliveryCount, strconv.Itoa(deliveries-1))
	r.Msg = msg
	r.ExtraData = map[string]any{deliveriesKey: deliveries}
	return r, nil
}

// SchemaInitializingQueries implements wsql.SchemaAdapter. The tables are
// shared by every queue, so the topic does not matter.
func (s schemaAdapter) SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams) ([]wsql.Query, error) {
	var qs []wsql.Query
	for _, stmt := range migrationStatements(s.n) {
		qs = append(qs, wsql.Query{Query: stmt})
	}
	return qs, nil
}

// SubscribeIsolationLevel implements wsql.SchemaAdapter. READ COMMITTED
// with SKIP LOCKED: under REPEATABLE READ (watermill-sql's queue schema),
// a competing consumer that meets a row changed since its snapshot fails
// with a serialization error instead of moving on.
func (s schemaAdapter) SubscribeIsolationLevel() stdsql.IsolationLevel {
	return stdsql.LevelReadCommitted
}
