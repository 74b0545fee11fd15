package pgtransport

import (
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

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
	messages, queues, bindings, channel string
}

func namesFor(prefix string) names {
	p := strings.ToLower(prefix)
	return names{
		messages: p + "queue_messages",
		queues:   p + "queues",
		bindings: p + "bindings",
		channel:  p + "queue_messages",
	}
}

// objects lists every table and index the schema creates.
func (n names) objects() []string {
	return []string{n.messages, n.messages + "_queue_idx", n.queues, n.bindings, n.bindings + "_queue_idx"}
}

func (n names) expand(tmpl string) string {
	return strings.NewReplacer("{messages}", n.messages, "{queues}", n.queues, "{bindings}", n.bindings).Replace(tmpl)
}

// schemaSQL creates the tables; every statement is idempotent.
//
//   - {messages}: one row per message per queue. A row is claimable when
//     visible_at has passed; a claim pushes visible_at forward by the lease
//     and counts the delivery, an ack deletes the row, a nack sets
//     visible_at to now plus the redelivery delay.
//   - {queues}: the declared queues (endpoint queues and error queues), so
//     that a send to a queue nobody declared fails instead of vanishing.
//   - {bindings}: (exchange, queue), written by every process at Start, so
//     a process that does not consume a type still routes it to the
//     endpoints of other processes.
const schemaSQL = `CREATE TABLE IF NOT EXISTS {messages} (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text        NOT NULL,
    message_id  text        NOT NULL DEFAULT '',
    metadata    json        NOT NULL DEFAULT '{}',
    payload     bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    visible_at  timestamptz NOT NULL DEFAULT now(),
    deliveries  integer     NOT NULL DEFAULT 0
) WITH (fillfactor = 90);
CREATE INDEX IF NOT EXISTS {messages}_queue_idx ON {messages} (queue, id);
CREATE TABLE IF NOT EXISTS {queues} (
    name       text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {bindings} (
    exchange   text        NOT NULL,
    queue      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (exchange, queue)
);
CREATE INDEX IF NOT EXISTS {bindings}_queue_idx ON {bindings} (queue);`

// MigrationSQL returns the SQL that creates the transport's tables for
// prefix (every statement idempotent, separated by ";\n"). Start runs it
// unless Config.DisableAutoMigrate is set; it is exported for teams that
// apply schema changes with their own migration tool.
func MigrationSQL(prefix string) (string, error) {
	if err := ValidatePrefix(prefix); err != nil {
		return "", err
	}
	return namesFor(prefix).expand(schemaSQL) + "\n", nil
}

func migrationStatements(n names) []string {
	var out []string
	for _, s := range strings.Split(n.expand(schemaSQL), ";\n") {
		if s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), ";")); s != "" {
			out = append(out, s)
		}
	}
	return out
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
