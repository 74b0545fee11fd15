package gormstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/internal/xactwatch"
	"github.com/barewire-go/barewire/outbox"
)

// Outbox implements outbox.Store and outbox.Notifier on the <prefix>outbox
// table. Obtain it from Store.Outbox.
type Outbox struct {
	s     *Store
	table string
	// channel is the PostgreSQL NOTIFY channel, named like the table.
	channel string

	claimSQL        string
	claimHeldSQL    string // PostgreSQL: ClaimBatch's, locks without a lease
	markHeldSQL     string
	deleteHeldSQL   string
	failHeldSQL     string
	laterHeldSQL    string
	markSQL         string
	deleteSQL       string
	releaseSQL      string
	releaseLaterSQL string // uncounted, claimable again after a delay
	releaseCountSQL string
	requeueSQL      string
	cleanupSQL      string
	statsSQL        string
	listSQL         string
	watchSQL        string
	insertOneSQL    string // insertSQL(1, false)
	insertOneXidSQL string // insertSQL(1, true)
	cancelSQL       string
	nextDueSQL      string
	scheduledCond   string

	// watch notifies other processes of commits (PostgreSQL only; nil on
	// SQLite).
	watch *commitWatch
}

// outboxColumns are the columns read back into outbox.Message.
const outboxColumns = `id, message_id, destination, routing_key, message_type, content_type, correlation_id,
headers, payload, created_at, status, attempts, last_error, delivered_at, available_at`

// insertColumns are the columns Add writes; the rest take their defaults
// (the database clock for created_at). available_at is the database clock
// shifted by the message's Delay.
const insertColumns = `message_id, destination, routing_key, message_type, content_type, correlation_id, headers, payload, ordering_key, available_at`

// insertParams is the number of bind parameters per inserted row.
const insertParams = 10

// maxInsertRows bounds one INSERT so that its parameters stay well inside
// SQLite's limit (32766) and PostgreSQL's (65535).
const maxInsertRows = 1000

// publishedMark is the last_error of a row released by a *RetryAfterError:
// it was published (its confirm not trusted yet), so Cancel must leave it.
const publishedMark = "published; its confirm was not trusted yet (RetryAfterError): sent again after the delay"

// maxIDsPerStatement bounds the id lists of MarkDelivered, Release and
// Requeue for the same reason.
const maxIDsPerStatement = 1000

// maxErrorLen caps the stored last error (stack traces can be huge).
const maxErrorLen = 4000

// outboxRow is the GORM model of an outbox row, used for scans.
type outboxRow struct {
	ID            int64  `gorm:"column:id"`
	MessageID     string `gorm:"column:message_id"`
	Destination   string `gorm:"column:destination"`
	RoutingKey    string `gorm:"column:routing_key"`
	MessageType   string `gorm:"column:message_type"`
	ContentType   string `gorm:"column:content_type"`
	CorrelationID string `gorm:"column:correlation_id"`
	Headers       string `gorm:"column:headers"`
	Payload       []byte `gorm:"column:payload"`
	CreatedAt     dbTime `gorm:"column:created_at"`
	Status        string `gorm:"column:status"`
	Attempts      int    `gorm:"column:attempts"`
	LastError     string `gorm:"column:last_error"`
	DeliveredAt   dbTime `gorm:"column:delivered_at"`
	AvailableAt   dbTime `gorm:"column:available_at"`
}

// dests are the scan destinations of outboxColumns, in their order.
func (r *outboxRow) dests() []any {
	return []any{&r.ID, &r.MessageID, &r.Destination, &r.RoutingKey, &r.MessageType, &r.ContentType, &r.CorrelationID,
		&r.Headers, &r.Payload, &r.CreatedAt, &r.Status, &r.Attempts, &r.LastError, &r.DeliveredAt, &r.AvailableAt}
}

func (r *outboxRow) message() (*outbox.Message, error) {
	m := &outbox.Message{
		ID:            r.ID,
		MessageID:     r.MessageID,
		Destination:   r.Destination,
		RoutingKey:    r.RoutingKey,
		MessageType:   r.MessageType,
		ContentType:   r.ContentType,
		CorrelationID: r.CorrelationID,
		Payload:       r.Payload,
		CreatedAt:     r.CreatedAt.Time,
		Status:        outbox.Status(r.Status),
		Attempts:      r.Attempts,
		LastError:     r.LastError,
		DeliveredAt:   r.DeliveredAt.ptr(),
		AvailableAt:   r.AvailableAt.Time,
	}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	if r.Headers != "" && r.Headers != "{}" {
		if err := json.Unmarshal([]byte(r.Headers), &m.Headers); err != nil {
			return nil, fmt.Errorf("gormstore: outbox row %d: bad headers: %w", r.ID, err)
		}
	}
	return m, nil
}

func newOutbox(s *Store) *Outbox {
	o := &Outbox{s: s, table: s.prefix + "outbox", channel: s.prefix + "outbox"}
	// Rows are claimed in the order they become due, so the scan of the
	// partial index (available_at, id) stops at the first row not yet due:
	// scheduled rows waiting in the future cost the claim nothing. Rows of
	// one transaction, and of transactions run one after the other, keep
	// their order (same or later available_at, then id).
	//
	// A row with an ordering key is claimable only when no older pending
	// row (leased or not, due or not) has the same key: per-key FIFO across
	// relays, one row per key in flight (docs/ordering.md). A parked row no
	// longer holds its key up. Rows without a key skip the look-up.
	const claimable = `status = 'pending' AND available_at <= {now} AND (locked_until IS NULL OR locked_until < {now})
AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM {outbox} AS older
WHERE older.ordering_key = cand.ordering_key AND older.status = 'pending' AND older.id < cand.id))`
	const claimOrder = `ORDER BY available_at, id`
	if s.dialect.name == DialectPostgres {
		// SKIP LOCKED: rows another relay is claiming right now are passed
		// over, not waited for. There is no cursor, so a row whose
		// transaction commits late (with a lower id) is found by the next
		// claim.
		o.claimSQL = s.query(`WITH claimed AS (
SELECT id FROM {outbox} AS cand WHERE ` + claimable + `
` + claimOrder + ` LIMIT ? FOR UPDATE OF cand SKIP LOCKED)
UPDATE {outbox} AS o SET locked_by = ?, locked_until = {now+?}
FROM claimed WHERE o.id = claimed.id
RETURNING ` + prefixColumns("o.", outboxColumns))
		o.cleanupSQL = s.query(`DELETE FROM {outbox} WHERE id IN (
SELECT id FROM {outbox} WHERE status = 'delivered' AND delivered_at < {now+?}
LIMIT ? FOR UPDATE SKIP LOCKED)`)
		// ClaimBatch's: the rows stay locked by the claiming transaction
		// instead of leased. The one-row subquery sets the transaction's
		// idle timeout (the batch's hold) in the same round trip; the
		// claim is LATERAL to it, so that it runs first and once whether
		// or not any row is claimed (a plain join evaluated it only for a
		// first claimed row: an empty claim's transaction, frozen before
		// its ROLLBACK, had no timeout). These run on a pgx connection
		// directly ($n placeholders, arrays).
		o.claimHeldSQL = s.dialect.bind(s.query(`SELECT ` + prefixColumns("c.", outboxColumns) + `
FROM (SELECT set_config('idle_in_transaction_session_timeout', ?, true) AS h) AS hold
CROSS JOIN LATERAL (SELECT ` + prefixColumns("cand.", outboxColumns) + ` FROM {outbox} AS cand
WHERE hold.h IS NOT NULL AND ` + claimable + `
` + claimOrder + ` LIMIT ? FOR UPDATE OF cand SKIP LOCKED) AS c`))
		o.markHeldSQL = s.query(`UPDATE {outbox} SET status = 'delivered', delivered_at = {now}
WHERE id = ANY($1) AND status = 'pending'`)
		o.deleteHeldSQL = s.query(`DELETE FROM {outbox} WHERE id = ANY($1) AND status = 'pending'`)
		// $3 is the row's MaxAttempts (<= 0: never parked).
		o.failHeldSQL = s.query(`UPDATE {outbox} SET attempts = attempts + 1, last_error = $1,
available_at = now() + make_interval(secs => $2),
status = CASE WHEN $3::int > 0 AND attempts + 1 >= $3::int THEN 'parked' ELSE 'pending' END
WHERE id = $4 AND status = 'pending'`)
		o.laterHeldSQL = s.query(`UPDATE {outbox} SET available_at = now() + make_interval(secs => $1),
last_error = '` + publishedMark + `' WHERE id = ANY($2) AND status = 'pending'`)
		// The commit watcher's one statement: the status of every watched
		// transaction and, when any of them committed, one NOTIFY. The
		// statement's own transaction commits without waiting for its WAL
		// flush (set_config is SET LOCAL): losing a notification in a crash
		// costs nothing but latency, and the flush would hold the
		// database-wide NOTIFY lock.
		o.watchSQL = `WITH s AS (
SELECT x, pg_xact_status(x) AS status FROM unnest(CAST(CAST(? AS text) AS xid8[])) AS x),
n AS (SELECT pg_notify(?, ?), set_config('synchronous_commit', 'off', true)
WHERE EXISTS (SELECT 1 FROM s WHERE status = 'committed'))
SELECT CAST(x AS text) AS xid, status, (SELECT count(*) FROM n) AS notified FROM s`
		o.watch = newCommitWatch(o, xactwatch.DefaultConfig)
	} else {
		// SQLite runs one writer at a time, so a single UPDATE is already
		// exclusive; the lease protects rows between claim and mark.
		o.claimSQL = s.query(`UPDATE {outbox} SET locked_by = ?, locked_until = {now+?}
WHERE id IN (SELECT id FROM {outbox} AS cand WHERE ` + claimable + ` ` + claimOrder + ` LIMIT ?)
RETURNING ` + outboxColumns)
		o.cleanupSQL = s.query(`DELETE FROM {outbox} WHERE id IN (
SELECT id FROM {outbox} WHERE status = 'delivered' AND delivered_at < {now+?}
LIMIT ?)`)
	}
	const leased = `id IN ? AND locked_by = ? AND status = 'pending'`
	o.markSQL = s.query(`UPDATE {outbox} SET status = 'delivered', delivered_at = {now}, locked_by = NULL, locked_until = NULL
WHERE ` + leased)
	o.deleteSQL = s.query(`DELETE FROM {outbox} WHERE ` + leased)
	o.releaseSQL = s.query(`UPDATE {outbox} SET locked_by = NULL, locked_until = NULL WHERE ` + leased)
	o.releaseLaterSQL = s.query(`UPDATE {outbox} SET locked_by = NULL, locked_until = NULL, available_at = {now+?},
last_error = '` + publishedMark + `' WHERE ` + leased)
	// SET expressions see the row's old values, so attempts + 1 is the new
	// count in both the CASE and the assignment.
	o.releaseCountSQL = s.query(`UPDATE {outbox} SET locked_by = NULL, locked_until = NULL,
attempts = attempts + 1, last_error = ?, available_at = {now+?},
status = CASE WHEN ? > 0 AND attempts + 1 >= ? THEN 'parked' ELSE 'pending' END
WHERE ` + leased)
	o.requeueSQL = s.query(`UPDATE {outbox} SET status = 'pending', attempts = 0, available_at = {now},
locked_by = NULL, locked_until = NULL WHERE status = 'parked'`)
	o.statsSQL = s.query(`SELECT
(SELECT COUNT(*) FROM {outbox} WHERE status = 'pending') AS pending,
(SELECT COUNT(*) FROM {outbox} WHERE status = 'parked') AS parked,
(SELECT COUNT(*) FROM {outbox} WHERE status = 'pending' AND available_at > {now} AND attempts = 0) AS scheduled,
(SELECT MIN(CASE WHEN attempts > 0 THEN created_at ELSE available_at END) FROM {outbox}
 WHERE status = 'pending' AND (available_at <= {now} OR attempts > 0)) AS oldest_pending`)
	o.listSQL = s.query(`SELECT ` + outboxColumns + ` FROM {outbox}`)
	o.insertOneSQL = o.buildInsertSQL(1, false)
	o.insertOneXidSQL = o.buildInsertSQL(1, true)
	// A row is cancellable only while it cannot have reached the broker:
	// not yet due (a due row may have been published by a relay whose
	// settlement then failed, leaving no trace), never failed, never
	// released by a *RetryAfterError (marked in last_error), and held by
	// no relay (a live lease; on PostgreSQL also a held batch's row lock,
	// skipped rather than waited for).
	cancellable := `message_id = ? AND status = 'pending' AND available_at > {now} AND attempts = 0 AND last_error = ''
AND (locked_until IS NULL OR locked_until < {now})`
	o.cancelSQL = s.query(`DELETE FROM {outbox} WHERE ` + cancellable)
	if s.dialect.name == DialectPostgres {
		o.cancelSQL = s.query(`DELETE FROM {outbox} WHERE id IN (SELECT id FROM {outbox}
WHERE ` + cancellable + ` FOR UPDATE SKIP LOCKED)`)
	}
	o.scheduledCond = s.query(` AND status = 'pending' AND available_at > {now} AND attempts = 0`)
	if s.dialect.name == DialectPostgres {
		o.nextDueSQL = s.query(`SELECT CAST(EXTRACT(EPOCH FROM (MIN(available_at) - {now})) AS double precision) AS secs
FROM {outbox} WHERE status = 'pending' AND available_at > {now}`)
	} else {
		o.nextDueSQL = s.query(`SELECT (julianday(MIN(available_at)) - julianday({now})) * 86400.0 AS secs
FROM {outbox} WHERE status = 'pending' AND available_at > {now}`)
	}
	return o
}

func prefixColumns(prefix, cols string) string {
	parts := strings.Split(cols, ",")
	for i, p := range parts {
		parts[i] = prefix + strings.TrimSpace(p)
	}
	return strings.Join(parts, ", ")
}

// Add implements outbox.Store. It inserts msgs with one multi-row INSERT
// (split only past 1000 rows) in the transaction carried by ctx (see
// WithTx) and sets each message's ID, CreatedAt and Status.
//
// On PostgreSQL the INSERT also returns the transaction's id, which Add
// hands to the store's commit watcher: once the transaction commits, the
// watcher sends one NOTIFY on the "<prefix>outbox" channel from its own
// connection (covering every commit it saw since its last check) and wakes
// this process's listeners directly. The caller's transaction itself runs
// no NOTIFY: PostgreSQL serialises the commits of notifying transactions,
// which would cost the producers their group commit.
func (o *Outbox) Add(ctx context.Context, msgs []*outbox.Message) error {
	tx, ok := TxFromContext(ctx)
	if !ok {
		return outbox.ErrNoTransaction
	}
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		switch {
		case m == nil:
			return fmt.Errorf("gormstore: outbox add: message %d is nil", i)
		case m.MessageID == "":
			return fmt.Errorf("gormstore: outbox add: message %d has no MessageID", i)
		case m.Destination == "":
			return fmt.Errorf("gormstore: outbox add: message %s has no Destination", m.MessageID)
		case m.Delay < 0:
			return fmt.Errorf("gormstore: outbox add: message %s has a negative Delay %v; use 0 to send at once", m.MessageID, m.Delay)
		}
	}
	// In a transaction of Begin the rows wait for the commit, which sends
	// them with the COMMIT (the checks above ran: what is wrong with a
	// message is still this call's error).
	if d, ok := conn(tx).(*DeferredTx); ok && d.keep(o, msgs) {
		return nil
	}
	// On PostgreSQL the first INSERT also returns the transaction id, in
	// the same statement: one round trip per Add, which is most of
	// PublishTx's cost.
	watch := o.watch != nil
	for _, part := range chunk(msgs, maxInsertRows) {
		xid, err := o.insert(ctx, conn(tx), part, watch)
		if err != nil {
			return err
		}
		if watch {
			o.watch.add(xid)
		}
		watch = false
	}
	return nil
}

// insertedRow is what Add reads back from its INSERT.
type insertedRow struct {
	ID        int64  `gorm:"column:id"`
	CreatedAt dbTime `gorm:"column:created_at"`
	// Xid is the inserting transaction's id (PostgreSQL, when asked).
	Xid string `gorm:"column:xid"`
}

// insert runs one INSERT on pool; with withXid (PostgreSQL) it also
// returns the transaction's id.
func (o *Outbox) insert(ctx context.Context, pool gorm.ConnPool, msgs []*outbox.Message, withXid bool) (string, error) {
	stmt := o.insertSQL(len(msgs), withXid)
	args, err := o.insertArgs(msgs)
	if err != nil {
		return "", err
	}
	rows, err := o.scanInserted(ctx, pool, stmt, args, len(msgs), withXid)
	if err != nil {
		return "", fmt.Errorf("gormstore: outbox add: %w", err)
	}
	if err := o.assign(msgs, rows); err != nil {
		return "", err
	}
	return rows[0].Xid, nil
}

// insertArgs are the INSERT's arguments for msgs.
func (o *Outbox) insertArgs(msgs []*outbox.Message) ([]any, error) {
	args := make([]any, 0, len(msgs)*insertParams)
	for _, m := range msgs {
		headers := "{}"
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("gormstore: outbox add %s: headers: %w", m.MessageID, err)
			}
			headers = string(b)
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{} // the column is NOT NULL
		}
		var key any // NULL: no key, claimed without the per-key check
		if k := m.Headers[wire.HeaderOrderingKey]; k != "" {
			key = k
		}
		args = append(args, m.MessageID, m.Destination, m.RoutingKey, m.MessageType, m.ContentType, m.CorrelationID, headers, payload, key, o.s.dialect.shift(m.Delay))
	}
	return args, nil
}

// assign sets what the INSERT returned on msgs.
func (o *Outbox) assign(msgs []*outbox.Message, rows []insertedRow) error {
	if len(rows) != len(msgs) {
		return fmt.Errorf("gormstore: outbox add: inserted %d rows, got %d ids back", len(msgs), len(rows))
	}
	// Ids are drawn in VALUES order; sorting makes the pairing independent
	// of the order RETURNING happens to use.
	if len(rows) > 1 {
		slices.SortFunc(rows, func(a, b insertedRow) int { return cmp.Compare(a.ID, b.ID) })
	}
	for i, m := range msgs {
		m.ID = rows[i].ID
		m.CreatedAt = rows[i].CreatedAt.Time
		m.Status = outbox.StatusPending
		m.Attempts = 0
		m.LastError = ""
		m.DeliveredAt = nil
	}
	return nil
}

// scanInserted runs the INSERT on pool and reads back what it returned.
func (o *Outbox) scanInserted(ctx context.Context, pool gorm.ConnPool, stmt string, args []any, n int, withXid bool) ([]insertedRow, error) {
	rs, err := pool.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	rows := make([]insertedRow, 0, n)
	for rs.Next() {
		var r insertedRow
		dest := []any{&r.ID, &r.CreatedAt}
		if withXid {
			dest = append(dest, &r.Xid)
		}
		if err := rs.Scan(dest...); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

// insertSQL is the INSERT of n messages in the dialect's placeholders; the
// one-message statements are built once.
func (o *Outbox) insertSQL(n int, withXid bool) string {
	if n == 1 {
		if withXid {
			return o.insertOneXidSQL
		}
		return o.insertOneSQL
	}
	return o.buildInsertSQL(n, withXid)
}

func (o *Outbox) buildInsertSQL(n int, withXid bool) string {
	var sql strings.Builder
	if withXid {
		sql.WriteString("WITH ins AS (")
	}
	sql.WriteString("INSERT INTO ")
	sql.WriteString(o.table)
	sql.WriteString(" (" + insertColumns + ") VALUES ")
	for i := range n {
		if i > 0 {
			sql.WriteString(", ")
		}
		sql.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, " + o.s.dialect.shifted + ")")
	}
	sql.WriteString(" RETURNING id, created_at")
	if withXid {
		// pg_current_xact_id is the top-level transaction's id, also inside
		// a savepoint (PostgreSQL 13 or later).
		sql.WriteString(") SELECT id, created_at, CAST(pg_current_xact_id() AS text) AS xid FROM ins")
	}
	return o.s.dialect.bind(sql.String())
}

// Claim implements outbox.Store: up to limit claimable rows, earliest due
// first (then lowest id), leased to owner.
func (o *Outbox) Claim(ctx context.Context, owner string, limit int, lease time.Duration) ([]*outbox.Message, error) {
	if err := checkClaim(owner, limit, "lease", lease); err != nil {
		return nil, err
	}
	var args []any
	if o.s.dialect.name == DialectPostgres {
		args = []any{limit, owner, o.s.dialect.shift(lease)}
	} else {
		args = []any{owner, o.s.dialect.shift(lease), limit}
	}
	var rows []outboxRow
	if err := o.s.db.WithContext(ctx).Raw(o.claimSQL, args...).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("gormstore: outbox claim: %w", err)
	}
	return toMessages(rows, true)
}

// checkClaim refuses the arguments no claim can run with; what names the
// duration (a lease, a hold) in the error.
func checkClaim(owner string, limit int, what string, d time.Duration) error {
	if owner == "" {
		return errors.New("gormstore: outbox claim: owner must not be empty")
	}
	if limit <= 0 {
		return fmt.Errorf("gormstore: outbox claim: limit must be positive, got %d", limit)
	}
	if d <= 0 {
		return fmt.Errorf("gormstore: outbox claim: %s must be positive, got %v", what, d)
	}
	return nil
}

func toMessages(rows []outboxRow, sortByID bool) ([]*outbox.Message, error) {
	if sortByID {
		// RETURNING has no defined order.
		slices.SortFunc(rows, func(a, b outboxRow) int { return cmp.Compare(a.ID, b.ID) })
	}
	msgs := make([]*outbox.Message, len(rows))
	for i := range rows {
		m, err := rows[i].message()
		if err != nil {
			return nil, err
		}
		msgs[i] = m
	}
	return msgs, nil
}

// MarkDelivered implements outbox.Store. Only rows still pending and leased
// by owner change; rows whose lease expired and were claimed by another
// relay are left to it.
func (o *Outbox) MarkDelivered(ctx context.Context, owner string, ids []int64, del bool) (int, error) {
	query := o.markSQL
	if del {
		query = o.deleteSQL
	}
	n, err := o.execIDs(ctx, ids, func(tx *gorm.DB, part []int64) *gorm.DB {
		return tx.Exec(query, part, owner)
	})
	if err != nil {
		return n, fmt.Errorf("gormstore: outbox mark delivered: %w", err)
	}
	return n, nil
}

// Release implements outbox.Store. maxAttempts <= 0 never parks.
func (o *Outbox) Release(ctx context.Context, owner string, ids []int64, lastErr string, countAttempt bool, retryAfter time.Duration, maxAttempts int) error {
	var do func(tx *gorm.DB, part []int64) *gorm.DB
	if countAttempt {
		lastErr = sanitizeError(lastErr)
		after := o.s.dialect.shift(max(retryAfter, 0))
		do = func(tx *gorm.DB, part []int64) *gorm.DB {
			return tx.Exec(o.releaseCountSQL, lastErr, after, maxAttempts, maxAttempts, part, owner)
		}
	} else if retryAfter > 0 {
		after := o.s.dialect.shift(retryAfter)
		do = func(tx *gorm.DB, part []int64) *gorm.DB {
			return tx.Exec(o.releaseLaterSQL, after, part, owner)
		}
	} else {
		do = func(tx *gorm.DB, part []int64) *gorm.DB {
			return tx.Exec(o.releaseSQL, part, owner)
		}
	}
	if _, err := o.execIDs(ctx, ids, do); err != nil {
		return fmt.Errorf("gormstore: outbox release: %w", err)
	}
	return nil
}

// Requeue implements outbox.Store.
func (o *Outbox) Requeue(ctx context.Context, ids []int64) (int, error) {
	if len(ids) == 0 {
		res := o.s.db.WithContext(ctx).Exec(o.requeueSQL)
		if res.Error != nil {
			return 0, fmt.Errorf("gormstore: outbox requeue: %w", res.Error)
		}
		return int(res.RowsAffected), nil
	}
	n, err := o.execIDs(ctx, ids, func(tx *gorm.DB, part []int64) *gorm.DB {
		return tx.Exec(o.requeueSQL+" AND id IN ?", part)
	})
	if err != nil {
		return n, fmt.Errorf("gormstore: outbox requeue: %w", err)
	}
	return n, nil
}

// execIDs runs one statement per chunk of ids, all in one transaction, and
// sums the rows affected.
func (o *Outbox) execIDs(ctx context.Context, ids []int64, do func(tx *gorm.DB, part []int64) *gorm.DB) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	parts := chunk(ids, maxIDsPerStatement)
	if len(parts) == 1 {
		res := do(o.s.db.WithContext(ctx), parts[0])
		return int(res.RowsAffected), res.Error
	}
	var n int
	err := o.s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		n = 0
		for _, part := range parts {
			res := do(tx, part)
			if res.Error != nil {
				return res.Error
			}
			n += int(res.RowsAffected)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// sanitizeError makes an error text storable: PostgreSQL text rejects NUL
// bytes and invalid UTF-8, and huge texts only bloat the table.
func sanitizeError(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) > maxErrorLen {
		s = strings.ToValidUTF8(s[:maxErrorLen], "") + "…"
	}
	return s
}

// Cleanup implements outbox.Store.
func (o *Outbox) Cleanup(ctx context.Context, retention time.Duration, batch int) (int, error) {
	if batch <= 0 {
		return 0, fmt.Errorf("gormstore: outbox cleanup batch must be positive, got %d", batch)
	}
	res := o.s.db.WithContext(ctx).Exec(o.cleanupSQL, o.s.dialect.shift(-retention), batch)
	if res.Error != nil {
		return 0, fmt.Errorf("gormstore: outbox cleanup: %w", res.Error)
	}
	return int(res.RowsAffected), nil
}

// Stats implements outbox.Store.
func (o *Outbox) Stats(ctx context.Context) (outbox.Stats, error) {
	var st struct {
		Pending       int64  `gorm:"column:pending"`
		Parked        int64  `gorm:"column:parked"`
		Scheduled     int64  `gorm:"column:scheduled"`
		OldestPending dbTime `gorm:"column:oldest_pending"`
	}
	if err := o.s.db.WithContext(ctx).Raw(o.statsSQL).Scan(&st).Error; err != nil {
		return outbox.Stats{}, fmt.Errorf("gormstore: outbox stats: %w", err)
	}
	return outbox.Stats{
		Pending:       st.Pending,
		Scheduled:     st.Scheduled,
		Parked:        st.Parked,
		OldestPending: st.OldestPending.Time,
	}, nil
}

// List implements outbox.Store: oldest (lowest id) first.
func (o *Outbox) List(ctx context.Context, q outbox.Query) ([]*outbox.Message, error) {
	sql := o.listSQL + " WHERE id > ?"
	args := []any{q.AfterID}
	if q.Status != "" {
		sql += " AND status = ?"
		args = append(args, string(q.Status))
	}
	if q.Scheduled {
		sql += o.scheduledCond
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	sql += " ORDER BY id LIMIT ?"
	args = append(args, limit)
	var rows []outboxRow
	if err := o.s.db.WithContext(ctx).Raw(sql, args...).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("gormstore: outbox list: %w", err)
	}
	return toMessages(rows, false)
}

// Cancel implements outbox.Store: it deletes the pending rows with
// messageID that no relay holds, in the transaction carried by ctx (see
// WithTx) when there is one.
func (o *Outbox) Cancel(ctx context.Context, messageID string) (int, error) {
	if messageID == "" {
		return 0, errors.New("gormstore: outbox cancel: empty message id")
	}
	db := o.s.db
	if tx, ok := TxFromContext(ctx); ok {
		db = tx
		// A message published earlier in this transaction must be there
		// to be canceled.
		if d, ok := conn(tx).(*DeferredTx); ok {
			if err := d.writeKept(ctx); err != nil {
				return 0, fmt.Errorf("gormstore: outbox cancel %s: %w", messageID, err)
			}
		}
	}
	res := db.WithContext(ctx).Exec(o.cancelSQL, messageID)
	if res.Error != nil {
		return 0, fmt.Errorf("gormstore: outbox cancel %s: %w", messageID, res.Error)
	}
	return int(res.RowsAffected), nil
}

// NextDue implements outbox.Store with one MIN over the partial index
// (available_at, id) of pending rows.
func (o *Outbox) NextDue(ctx context.Context) (time.Duration, bool, error) {
	var r struct {
		Secs *float64 `gorm:"column:secs"`
	}
	if err := o.s.db.WithContext(ctx).Raw(o.nextDueSQL).Scan(&r).Error; err != nil {
		return 0, false, fmt.Errorf("gormstore: outbox next due: %w", err)
	}
	if r.Secs == nil {
		return 0, false, nil
	}
	return max(time.Duration(*r.Secs*float64(time.Second)), 0), true, nil
}
