package pgtransport

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/pgerr"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/internal/xactwatch"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

var (
	_ transport.Transport   = (*Transport)(nil)
	_ transport.ReplyQueues = (*Transport)(nil)
)

// Errors.
var (
	// ErrNoQueue is returned by Deliver for a send to a queue that no
	// process declared.
	ErrNoQueue = errors.New("pgtransport: no such queue")
	// ErrNotSameDatabase is returned by DeliverTx when the transaction in
	// the context is not on the transport's database; the caller then
	// writes to its outbox instead.
	ErrNotSameDatabase = fmt.Errorf("pgtransport: the transaction is not on the transport's database: %w", transport.ErrTxUnsupported)
	errClosed          = errors.New("pgtransport: transport closed")
)

// Defaults of Config.
const (
	DefaultPollInterval           = time.Second
	DefaultLease                  = 30 * time.Second
	DefaultRedeliveryDelay        = 100 * time.Millisecond
	DefaultLongTransactionWarning = time.Minute
)

// Config configures the PostgreSQL transport: the receive endpoints
// (declared through the embedded Endpoints, as on every transport) and the
// transport's own settings. Zero fields take the defaults written on each.
type Config struct {
	endpoint.Endpoints

	// TablePrefix prefixes the transport's tables (queue_messages,
	// queues, bindings). Defaults to "barewire_".
	TablePrefix string
	// PollInterval is the safety-net poll of an idle consumer; a NOTIFY
	// sent when a message commits wakes it sooner. Defaults to 1s.
	PollInterval time.Duration
	// Lease is how long a claimed message stays invisible to other
	// consumers. It is extended while the handler runs, so it only bounds
	// how soon a message held by a crashed process is redelivered.
	// Defaults to 30s.
	Lease time.Duration
	// RedeliveryDelay is how long a nacked message waits before any
	// consumer may take it again. Other messages are not held up.
	// Defaults to 100ms; negative means at once.
	RedeliveryDelay time.Duration
	// LongTransactionWarning logs a warning for every transaction on the
	// database open longer than this (it holds back the cleanup of
	// acknowledged rows, which slows claims). Defaults to 1 minute;
	// negative disables the check.
	LongTransactionWarning time.Duration
	// LongTransactionCheckInterval is how often the check runs. Defaults
	// to half of LongTransactionWarning, at most 30s.
	LongTransactionCheckInterval time.Duration
	// DisableAutoMigrate stops Start from creating the tables; apply
	// Migrations (or MigrationSQL) with your own tool. Start then checks
	// that they exist and fails naming any missing.
	DisableAutoMigrate bool
}

func (c *Config) defaults() {
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultTablePrefix
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.RedeliveryDelay == 0 {
		c.RedeliveryDelay = DefaultRedeliveryDelay
	} else if c.RedeliveryDelay < 0 {
		c.RedeliveryDelay = 0
	}
	if c.LongTransactionWarning == 0 {
		c.LongTransactionWarning = DefaultLongTransactionWarning
	}
	if c.LongTransactionCheckInterval == 0 && c.LongTransactionWarning > 0 {
		c.LongTransactionCheckInterval = min(c.LongTransactionWarning/2, 30*time.Second)
	}
}

// Validate reports every problem with c (before defaults apply).
func (c Config) Validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("pgtransport: "+format, args...)) }
	if c.TablePrefix != "" {
		if err := ValidatePrefix(c.TablePrefix); err != nil {
			errs = append(errs, err)
		}
	}
	if c.PollInterval < 0 {
		bad("PollInterval %v is negative", c.PollInterval)
	}
	if c.Lease < 0 {
		bad("Lease %v is negative", c.Lease)
	} else if c.Lease > 0 && c.Lease < 100*time.Millisecond {
		bad("Lease %v is too short; use at least 100ms", c.Lease)
	}
	if c.LongTransactionCheckInterval < 0 {
		bad("LongTransactionCheckInterval %v is negative", c.LongTransactionCheckInterval)
	}
	return errs
}

// Transport is the PostgreSQL transport. It is safe for concurrent use.
type Transport struct {
	sqlDB *sql.DB
	db    *gorm.DB
	cfg   Config
	log   *slog.Logger
	built bool
	// onCommitted (transport.Env.OnCommitted) is called with the messages
	// DeliverTx wrote once their transaction is seen to have committed
	// (usually within milliseconds; never for a rolled-back one, and not
	// at all for a transaction still open after a minute or past 4096
	// watched ones). It runs on the commit watcher's goroutine.
	onCommitted func(msgs []*outbox.Message)
	// deliverTimeout bounds one Deliver: half of the relay's lease, at
	// most 30s (a silent database must not hold a relay worker, nor Stop).
	deliverTimeout time.Duration
	n              names
	schema         schemaAdapter
	pub            *wsql.Publisher

	ctx    context.Context // lifetime: canceled by Close; messages' contexts derive from it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	started  bool
	closed   bool
	signals  map[string]*signal
	known    map[string]bool     // queues known to exist
	local    map[string][]string // exchange → local queues bound to it
	listenOK bool

	pendingMu sync.Mutex
	pending   map[string]bool // destinations to notify
	kick      chan struct{}

	// watch follows the transactions DeliverTx wrote in until they commit.
	watch *xactwatch.Watcher
	// inflight maps each message handed to a handler to its claim, for
	// AckTx and AckedInTx.
	inflight sync.Map // *message.Message → *claimed
	// versionNum, when not zero, is taken for the server's
	// server_version_num (tests pretend to be an older server).
	versionNum int
}

// New returns the PostgreSQL transport on db, to hand to
// bus.WithTransport. db must be a PostgreSQL database opened with
// gorm.io/driver/postgres (the pgx driver). configure declares the receive
// endpoints and sets the transport's options; it runs once, now. New does
// no I/O and reports nothing: the bus's New reports every mistake when it
// builds the transport. Unless bus.WithDatabase chooses another database, the
// bus keeps its inbox and outbox in db too (see Database). A Transport
// serves one bus.
func New(db *gorm.DB, configure func(c *Config)) *Transport {
	t := &Transport{db: db}
	if configure != nil {
		configure(&t.cfg)
	}
	return t
}

// Endpoints returns the receive endpoints declared in New's block.
func (t *Transport) Endpoints() *endpoint.Endpoints { return &t.cfg.Endpoints }

// Database returns the database the transport's tables are in; the bus
// keeps its inbox and outbox there too unless told otherwise, so that a
// message published inside a transaction on it is written straight to its
// queues in that transaction.
func (t *Transport) Database() *gorm.DB { return t.db }

// System names the transport for telemetry: "postgresql".
func (t *Transport) System() string { return "postgresql" }

// Build validates the configuration and readies the transport; it does no
// I/O. It may be called again until the transport is started (a bus.New
// that failed can be retried with the same transport); the last call
// counts.
func (t *Transport) Build(env transport.Env) (transport.Transport, error) {
	t.mu.Lock()
	started := t.started
	t.mu.Unlock()
	if started {
		return nil, errors.New("pgtransport: this transport is already started for a bus; call New for each bus")
	}
	if t.built {
		t.cancel() // built before by a New that failed: build afresh
	}
	db, cfg := t.db, t.cfg
	if db == nil || db.Config == nil || db.Dialector == nil {
		return nil, errors.New("pgtransport: db is nil; pass a *gorm.DB opened with gorm.io/driver/postgres")
	}
	if name := db.Dialector.Name(); name != "postgres" {
		return nil, fmt.Errorf("pgtransport: db is %q; the PostgreSQL transport needs a PostgreSQL database", name)
	}
	errs := cfg.Validate()
	errs = append(errs, transport.CheckPlainEndpoints("pgtransport", cfg.List())...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg.defaults()
	t.deliverTimeout = 30 * time.Second
	if half := env.RelayLease / 2; half > 0 && half < t.deliverTimeout {
		t.deliverTimeout = half
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("pgtransport: %w", err)
	}
	log := env.Logger
	if log == nil {
		log = slog.Default()
	}
	n := namesFor(cfg.TablePrefix)
	schema := newSchemaAdapter(n, cfg.Lease)
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(sqlDB), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	if err != nil {
		return nil, fmt.Errorf("pgtransport: %w", err)
	}
	t.built = true
	t.sqlDB, t.cfg, t.log, t.n, t.schema, t.pub = sqlDB, cfg, log.With("transport", "postgres"), n, schema, pub
	t.onCommitted = env.OnCommitted
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.signals, t.known, t.local = map[string]*signal{}, map[string]bool{}, map[string][]string{}
	t.pending, t.kick = map[string]bool{}, make(chan struct{}, 1)
	t.watch = xactwatch.New(xactwatch.DefaultConfig, t.watchQuery, t.committed)
	return t, nil
}

// Tables returns the names of the transport's tables.
func (t *Transport) Tables() (messages, queues, bindings string) {
	return t.n.messages, t.n.queues, t.n.bindings
}

// Start checks that the server is PostgreSQL 13 or newer, creates the
// tables (with DisableAutoMigrate, checks that they exist), declares each
// endpoint's queue and error queue, binds the queue to one exchange per
// consumed message type and to the endpoint's extra bindings, and starts
// listening for new messages and watching for long transactions.
// Declaring is idempotent.
func (t *Transport) Start(ctx context.Context, eps []*endpoint.Endpoint) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errClosed
	}
	if !t.built {
		return errors.New("pgtransport: transport not built; hand it to bus.WithTransport, or call Build first")
	}
	if t.started {
		return errors.New("pgtransport: already started")
	}
	var queues, bx, bq []string
	for _, ep := range eps {
		queues = append(queues, ep.Name())
		if ep.ErrorQueue != "" {
			queues = append(queues, ep.ErrorQueue)
		}
		for _, typ := range ep.MessageTypes() {
			bx, bq = append(bx, typ), append(bq, ep.Name())
		}
		for _, b := range ep.Bindings {
			bx, bq = append(bx, b.Exchange), append(bq, ep.Name())
		}
	}
	err := t.inTx(ctx, func(tx *sql.Tx) error {
		if err := t.prepareSchema(ctx, tx); err != nil {
			return err
		}
		if len(queues) > 0 {
			if _, err := tx.ExecContext(ctx, t.n.expand(`INSERT INTO {queues} (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`), queues); err != nil {
				return fmt.Errorf("declare queues: %w", err)
			}
		}
		if len(bx) > 0 {
			if _, err := tx.ExecContext(ctx, t.n.expand(`INSERT INTO {bindings} (exchange, queue) SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING`), bx, bq); err != nil {
				return fmt.Errorf("declare bindings: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgtransport: start: %w", err)
	}
	for _, q := range queues {
		t.known[q] = true
	}
	for i, x := range bx {
		if !slices.Contains(t.local[x], bq[i]) {
			t.local[x] = append(t.local[x], bq[i])
		}
	}
	t.started = true
	t.wg.Go(func() { t.listenLoop(t.ctx) })
	t.wg.Go(func() { t.notifyLoop(t.ctx) })
	if t.cfg.LongTransactionWarning > 0 {
		t.wg.Go(func() { t.watchLongTransactions(t.ctx) })
	}
	t.log.DebugContext(ctx, "postgres transport started", "queues", len(queues), "bindings", len(bx), "table", t.n.messages)
	return nil
}

// DeclareReplyQueue declares queue name (a bus instance's reply queue) as
// Start declares endpoint queues. The queue outlives a process that crashes
// (its rows wait there); a process that stops deletes it (DeleteReplyQueue).
func (t *Transport) DeclareReplyQueue(ctx context.Context, name string) error {
	if t.isClosed() {
		return fmt.Errorf("%w: %w", errClosed, outbox.ErrTransportUnavailable)
	}
	if _, err := t.sqlDB.ExecContext(ctx, t.n.expand(`INSERT INTO {queues} (name) VALUES ($1) ON CONFLICT DO NOTHING`), name); err != nil {
		return fmt.Errorf("pgtransport: declare queue %q: %w", name, err)
	}
	t.mu.Lock()
	t.known[name] = true
	t.mu.Unlock()
	return nil
}

// DeleteReplyQueue deletes queue name and the messages waiting in it.
// Sends to it from now on write nothing: from a process that never saw the
// queue they fail with ErrNoQueue, from one that did they reach no row.
func (t *Transport) DeleteReplyQueue(ctx context.Context, name string) error {
	err := t.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, t.n.expand(`DELETE FROM {queues} WHERE name = $1`), name); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, t.n.expand(`DELETE FROM {messages} WHERE queue = $1`), name)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgtransport: delete queue %q: %w", name, err)
	}
	t.mu.Lock()
	delete(t.known, name)
	t.mu.Unlock()
	return nil
}

// migrateTurnTimeout bounds the wait for another process migrating the
// same tables (a variable for tests).
var migrateTurnTimeout = "30s"

// migrate creates the tables and indexes that do not exist yet. When they
// all exist (every start but the first) it runs no DDL at all: even CREATE
// INDEX IF NOT EXISTS takes a SHARE lock on the table before it finds the
// index, which would queue behind any open transaction that wrote a message
// and hold up every insert behind itself, on a live system, at each
// restart of any process.
func (t *Transport) migrate(ctx context.Context, tx *sql.Tx) error {
	ok, err := t.schemaExists(ctx, tx)
	if err != nil || ok {
		return err
	}
	// CREATE ... IF NOT EXISTS races with a concurrent CREATE, so
	// processes starting together take turns (per prefix). The wait for
	// the turn is bounded by migrateTurnTimeout: a process frozen while it
	// holds the turn fails this Start with a clear error instead of
	// hanging it.
	var lockTimeout string
	if err := tx.QueryRowContext(ctx, "SELECT current_setting('lock_timeout')").Scan(&lockTimeout); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, true)", migrateTurnTimeout); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", advisoryKey("barewire:pgtransport:"+t.n.messages)); err != nil {
		if pgerr.SQLState(err) == "55P03" {
			return fmt.Errorf("another process has held the migration lock of tables %s* for over %s (a migration running in a frozen or slow process?): %w", t.n.prefix, migrateTurnTimeout, err)
		}
		return err
	}
	if _, err := tx.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, true)", lockTimeout); err != nil {
		return err
	}
	for _, stmt := range migrationStatements(t.n) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%w\nstatement:\n%s", err, stmt)
		}
	}
	return nil
}

// schemaExists reports whether every table and index of the schema exists
// (in the search path, as the unqualified names the transport uses).
func (t *Transport) schemaExists(ctx context.Context, tx *sql.Tx) (bool, error) {
	var ok bool
	err := tx.QueryRowContext(ctx, `SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest($1::text[]) AS n`, t.n.objects()).Scan(&ok)
	return ok, err
}

// Deliver writes msgs to their queues: an "exchange:<X>" message gets one
// row in every queue bound to X (none when nothing is bound, as with a
// broker), a "queue:<Q>" message one row in Q, or ErrNoQueue when no process
// declared Q. A nil error means the row is committed. It takes at most half
// of the relay's lease (30s at most); past it the messages fail as
// outbox.ErrTransportUnavailable.
func (t *Transport) Deliver(ctx context.Context, msgs []*outbox.Message) []error {
	ctx, cancel := context.WithTimeout(ctx, t.deliverTimeout)
	defer cancel()
	errs := make([]error, len(msgs))
	if t.isClosed() {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %w", errClosed, outbox.ErrTransportUnavailable)
		}
		return errs
	}
	idx := t.checkQueues(ctx, msgs, errs)
	if len(idx) == 0 {
		return errs
	}
	defer t.notifyDelivered(msgs, errs)
	err := t.publish(ctx, t.pub, msgs, idx)
	if err == nil {
		return errs
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !pgerr.ConnectionClass(err) && len(idx) > 1 {
		// The server refused the batch (say, an id PostgreSQL cannot
		// store): deliver one by one so that only the bad message fails.
		for _, i := range idx {
			errs[i] = t.publish(ctx, t.pub, msgs, []int{i})
		}
		return errs
	}
	for _, i := range idx {
		errs[i] = err
	}
	return errs
}

// notifyDelivered queues a notification for the destinations of the
// messages written.
func (t *Transport) notifyDelivered(msgs []*outbox.Message, errs []error) {
	dests := make([]string, 0, len(msgs))
	for i, m := range msgs {
		if errs[i] == nil {
			dests = append(dests, notifyDestination(m.Destination))
		}
	}
	t.pendingMu.Lock()
	for _, d := range dests {
		t.pending[d] = true
	}
	t.pendingMu.Unlock()
	if len(dests) > 0 {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// notifyLoop sends the queued notifications, one statement for all the
// destinations gathered since the last one, outside the inserting
// transactions (see schemaAdapter.notify), and wakes local consumers at
// once.
func (t *Transport) notifyLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.kick:
		}
		t.pendingMu.Lock()
		dests := slices.Collect(maps.Keys(t.pending))
		clear(t.pending)
		t.pendingMu.Unlock()
		if len(dests) == 0 {
			continue
		}
		for _, d := range dests {
			t.wakeDestination(d)
		}
		t.sendNotify(ctx, dests)
	}
}

// sendNotify notifies the other processes of new messages for dests, in
// one statement of its own.
func (t *Transport) sendNotify(ctx context.Context, dests []string) {
	if len(dests) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	_, err := t.sqlDB.ExecContext(qctx, `SELECT pg_notify($1, d) FROM unnest($2::text[]) AS d`, t.n.channel, dests)
	if err != nil && ctx.Err() == nil {
		// Other processes' consumers find the messages at their next poll.
		t.log.Debug("postgres transport: NOTIFY failed", "error", err)
	}
}

// notifyDestination is what a notification for a message sent to dest
// names: the destination in its canonical "<kind>:<name>" form.
func notifyDestination(dest string) string {
	kind, name := wire.ParseDestination(dest)
	return kind + ":" + name
}

// wakeDestination wakes the local consumers of the queues a destination
// reaches: the queue itself, or the local queues bound to the exchange.
func (t *Transport) wakeDestination(dest string) {
	kind, name := wire.ParseDestination(dest)
	if kind == "queue" {
		t.wake(name)
		return
	}
	t.mu.Lock()
	qs := slices.Clone(t.local[name])
	t.mu.Unlock()
	for _, q := range qs {
		t.wake(q)
	}
}

// DeliverTx writes msgs in the transaction carried by ctx (put there with
// gormstore.WithTx): they become visible, and consumers are woken, when it
// commits, and vanish if it rolls back. It returns ErrNotSameDatabase when
// that transaction is not on the transport's database (the caller should
// then use its outbox), outbox.ErrNoTransaction when ctx carries none, and
// ErrNoQueue for a send to an undeclared queue (checked before anything is
// written, so the transaction stays usable).
func (t *Transport) DeliverTx(ctx context.Context, msgs []*outbox.Message) error {
	tx, ok := gormstore.TxFromContext(ctx)
	if !ok {
		return outbox.ErrNoTransaction
	}
	if !t.SharesDB(tx) {
		return ErrNotSameDatabase
	}
	if t.isClosed() {
		return fmt.Errorf("%w: %w", errClosed, outbox.ErrTransportUnavailable)
	}
	errs := make([]error, len(msgs))
	idx := t.checkQueues(ctx, msgs, errs)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// No NOTIFY in the caller's transaction (see schemaAdapter.inTx): the
	// insert returns the transaction's id, and the commit watcher notifies
	// and wakes the consumers once that transaction has committed.
	exec := &txExecutor{p: tx.Statement.ConnPool}
	pub, err := wsql.NewPublisher(exec, wsql.PublisherConfig{SchemaAdapter: t.schema.forTx()}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("pgtransport: %w", err)
	}
	if err := t.publish(ctx, pub, msgs, idx); err != nil {
		return err
	}
	tags := make([]any, 0, len(idx))
	for _, i := range idx {
		tags = append(tags, msgs[i])
	}
	t.watch.Add(exec.xid, tags...)
	return nil
}

// committed is the commit watcher's callback: the messages that
// DeliverTx wrote in transactions that have now committed. Their
// destinations are notified (and local consumers woken) by notifyLoop,
// and onCommitted hears of them.
func (t *Transport) committed(tags []any) {
	msgs := make([]*outbox.Message, 0, len(tags))
	for _, tag := range tags {
		if m, ok := tag.(*outbox.Message); ok {
			msgs = append(msgs, m)
		}
	}
	t.mu.Lock()
	running := t.started && !t.closed
	t.mu.Unlock()
	if running {
		t.notifyDelivered(msgs, make([]error, len(msgs)))
	} else {
		// A process that publishes without starting the bus (a producer
		// only) has no notify loop and no consumers to wake: notify the
		// other processes from here.
		dests := map[string]bool{}
		for _, m := range msgs {
			dests[notifyDestination(m.Destination)] = true
		}
		t.sendNotify(t.ctx, slices.Collect(maps.Keys(dests)))
	}
	if t.onCommitted != nil && len(msgs) > 0 {
		t.onCommitted(msgs)
	}
}

// watchQuery asks pg_xact_status for the watched transactions. The
// statement commits without waiting for its WAL flush: it writes nothing.
func (t *Transport) watchQuery(ctx context.Context, xids string) (map[uint64]xactwatch.Status, error) {
	rows, err := t.sqlDB.QueryContext(ctx, `SELECT CAST(x AS text), coalesce(pg_xact_status(x), '') FROM unnest(CAST(CAST($1 AS text) AS xid8[])) AS x`, xids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[uint64]xactwatch.Status{}
	for rows.Next() {
		var x, st string
		if err := rows.Scan(&x, &st); err != nil {
			return nil, err
		}
		if id, err := strconv.ParseUint(x, 10, 64); err == nil {
			out[id] = xactwatch.ParseStatus(st)
		}
	}
	return out, rows.Err()
}

// AckTx deletes the row of msg (a message this transport delivered and
// whose verdict is pending) in the transaction carried by ctx, the one that
// commits the handler's effects, so that the message is acknowledged if and
// only if they commit: no redelivery after a crash between the commit and
// the ack, and one statement less per message. It reports whether it did:
// false when msg is not this transport's, the transaction is on another
// database, or the lease was lost (the row was claimed again; the inbox
// decides who wins). Call AckedInTx after that transaction has committed.
func (t *Transport) AckTx(ctx context.Context, msg *message.Message) (bool, error) {
	v, ok := t.inflight.Load(msg)
	if !ok {
		return false, nil
	}
	c := v.(*claimed)
	tx, ok := gormstore.TxFromContext(ctx)
	if !ok || !t.SharesDB(tx) {
		return false, nil
	}
	res, err := tx.Statement.ConnPool.ExecContext(ctx, t.schema.ackTxSQL, c.id, c.deliveries)
	if err != nil {
		return false, fmt.Errorf("pgtransport: ack in transaction: %w", err)
	}
	n, err := res.RowsAffected()
	return err == nil && n == 1, err
}

// AckedInTx records that the transaction in which AckTx deleted msg's row
// has committed, so that the message's Ack changes nothing more.
func (t *Transport) AckedInTx(msg *message.Message) {
	if v, ok := t.inflight.Load(msg); ok {
		v.(*claimed).ackedInTx.Store(true)
	}
}

// SharesDB reports whether tx (a *gorm.DB, in a transaction or not) runs on
// the transport's connection pool, so that DeliverTx can write in it.
func (t *Transport) SharesDB(tx *gorm.DB) bool {
	if tx == nil || tx.Config == nil || tx.Dialector == nil || tx.Dialector.Name() != "postgres" {
		return false
	}
	sqlDB, err := tx.DB()
	return err == nil && sqlDB == t.sqlDB
}

// publish inserts msgs[idx] through a watermill-sql Publisher.
func (t *Transport) publish(ctx context.Context, pub *wsql.Publisher, msgs []*outbox.Message, idx []int) error {
	wms := make([]*message.Message, len(idx))
	for j, i := range idx {
		wms[j] = toWatermill(msgs[i])
	}
	wms[0].SetContext(ctx)
	err := pub.Publish(topic, wms...)
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !pgerr.ConnectionClass(err) {
		return fmt.Errorf("pgtransport: %w", err)
	}
	// Not judged by the server's verdict on the rows: connection trouble
	// (a session terminated, the server restarting) or a canceled context.
	return fmt.Errorf("pgtransport: %w: %w", err, outbox.ErrTransportUnavailable)
}

// checkQueues fails the sends to undeclared queues and returns the indexes
// of the messages that may be written.
func (t *Transport) checkQueues(ctx context.Context, msgs []*outbox.Message, errs []error) []int {
	var unknown []string
	t.mu.Lock()
	for _, m := range msgs {
		if kind, name := wire.ParseDestination(m.Destination); kind == "queue" && !t.known[name] && !slices.Contains(unknown, name) {
			unknown = append(unknown, name)
		}
	}
	t.mu.Unlock()
	lookupErr := error(nil)
	if len(unknown) > 0 {
		found, err := t.lookupQueues(ctx, unknown)
		if err != nil {
			lookupErr = fmt.Errorf("pgtransport: look up queues: %w: %w", err, outbox.ErrTransportUnavailable)
		}
		t.mu.Lock()
		for _, q := range found {
			t.known[q] = true // queues are never dropped by the transport
		}
		t.mu.Unlock()
	}
	idx := make([]int, 0, len(msgs))
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, m := range msgs {
		kind, name := wire.ParseDestination(m.Destination)
		switch {
		case name == "":
			errs[i] = fmt.Errorf("pgtransport: message %q: empty destination %q", m.MessageID, m.Destination)
		case kind == "queue" && !t.known[name] && lookupErr != nil:
			errs[i] = lookupErr
		case kind == "queue" && !t.known[name]:
			errs[i] = &noQueueError{fmt.Sprintf("%v %q (declare an endpoint with that name)", ErrNoQueue, name)}
		default:
			idx = append(idx, i)
		}
	}
	return idx
}

func (t *Transport) lookupQueues(ctx context.Context, queues []string) ([]string, error) {
	rows, err := t.sqlDB.QueryContext(ctx, t.n.expand(`SELECT name FROM {queues} WHERE name = ANY($1::text[])`), queues)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			return nil, err
		}
		found = append(found, q)
	}
	return found, rows.Err()
}

func (t *Transport) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := t.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// toWatermill builds the row's message: the headers plus the message's own
// fields (id, type, content type, correlation id, destination) as headers,
// as the other transports deliver them.
func toWatermill(m *outbox.Message) *message.Message {
	h := message.Metadata(transport.Headers(m, 1))
	h[wire.HeaderDestination] = notifyDestination(m.Destination)
	wm := message.NewMessage(m.MessageID, m.Payload)
	wm.Metadata = h
	return wm
}

// txExecutor runs watermill-sql's insert on a GORM connection pool (a
// *sql.Tx inside a transaction). The Publisher only executes the insert and
// ignores its result, so ExecContext runs it as a query and keeps the
// transaction id that the forTx insert returns, without another round
// trip.
type txExecutor struct {
	p   gorm.ConnPool
	xid string
}

func (e *txExecutor) ExecContext(ctx context.Context, q string, args ...any) (wsql.Result, error) {
	var n int64
	if err := e.p.QueryRowContext(ctx, q, args...).Scan(&n, &e.xid); err != nil {
		return nil, err
	}
	return rowsAffected(n), nil
}

func (e *txExecutor) QueryContext(ctx context.Context, q string, args ...any) (wsql.Rows, error) {
	return e.p.QueryContext(ctx, q, args...)
}

type rowsAffected int64

func (r rowsAffected) LastInsertId() (int64, error) {
	return 0, errors.New("pgtransport: no last insert id")
}

func (r rowsAffected) RowsAffected() (int64, error) { return int64(r), nil }

// Len returns how many messages queue holds, in flight or not (for tests,
// samples and operations).
func (t *Transport) Len(ctx context.Context, queue string) (int, error) {
	var n int
	err := t.sqlDB.QueryRowContext(ctx, t.n.expand(`SELECT count(*) FROM {messages} WHERE queue = $1`), queue).Scan(&n)
	return n, err
}

// Health reports nil while the database answers.
func (t *Transport) Health(ctx context.Context) error {
	if t.isClosed() {
		return errClosed
	}
	if err := t.sqlDB.PingContext(ctx); err != nil {
		return fmt.Errorf("pgtransport: %w", err)
	}
	return nil
}

// Close stops every subscription and background task. A message still in
// a handler stays leased and is redelivered after Lease. The database is
// the caller's and stays open.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	built := t.built
	t.mu.Unlock()
	if !built {
		return nil
	}
	t.cancel()
	t.watch.Close()
	t.wg.Wait()
	// The watermill-sql Publisher holds no resources (Deliver checks
	// closed itself), so it is left as it is: closing it would race with a
	// Deliver still running.
	return nil
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// signal wakes the idle consumers of one queue, one at a time: it holds at
// most one token, a notification puts it there (or leaves it if one is
// already waiting), and the consumer that takes it passes it on after a
// successful claim, so a burst of messages ramps up every consumer while a
// single message costs at most one empty claim. A token put while every
// consumer is busy waits for the next one to go idle: no wake-up is lost.
type signal struct{ ch chan struct{} }

func (s *signal) fire() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

func (t *Transport) signal(queue string) *signal {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.signals[queue]
	if s == nil {
		s = &signal{ch: make(chan struct{}, 1)}
		t.signals[queue] = s
	}
	return s
}

// wake wakes the local consumers of queue ("" wakes all).
func (t *Transport) wake(queue string) {
	t.mu.Lock()
	var ss []*signal
	if queue == "" {
		ss = slices.Collect(maps.Values(t.signals))
	} else if s := t.signals[queue]; s != nil {
		ss = []*signal{s}
	}
	t.mu.Unlock()
	for _, s := range ss {
		s.fire()
	}
}

// listenLoop LISTENs on the transport's channel on a dedicated connection
// and wakes the consumers of each notified queue, reconnecting with a
// backoff. While it is down, consumers still poll.
func (t *Transport) listenLoop(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := t.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("postgres transport: LISTEN connection lost; consumers poll until it is back", "error", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(wait*2, 10*time.Second)
	}
}

func (t *Transport) listen(ctx context.Context) error {
	conn, err := t.sqlDB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var loopErr error
	_ = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			loopErr = fmt.Errorf("need the pgx stdlib driver, have %T", dc)
			return nil
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, `LISTEN "`+t.n.channel+`"`); err != nil {
			loopErr = err
			return driver.ErrBadConn
		}
		t.mu.Lock()
		t.listenOK = true
		t.mu.Unlock()
		defer func() {
			t.mu.Lock()
			t.listenOK = false
			t.mu.Unlock()
		}()
		// Anything committed while no one listened is found now.
		t.wake("")
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				loopErr = err
				// The session is subscribed or its wait was cut short:
				// not fit for the pool any more.
				return driver.ErrBadConn
			}
			t.wakeDestination(n.Payload)
		}
	})
	return loopErr
}

// CommitWatch reports the counters of the watcher that follows DeliverTx's
// transactions (for tests and diagnostics).
func (t *Transport) CommitWatch() xactwatch.Stats { return t.watch.Stats() }

// Listening reports whether the NOTIFY listener is connected (for tests
// and health pages; consumers poll when it is not).
func (t *Transport) Listening() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.listenOK
}

// watchLongTransactions logs a warning for each transaction open longer
// than LongTransactionWarning on this database. Such a transaction holds
// back vacuum, so acknowledged (deleted) rows pile up and every claim has
// to step over them: delivery slows down rather than stalls, and this log
// says why and since when.
func (t *Transport) watchLongTransactions(ctx context.Context) {
	tick := time.NewTicker(t.cfg.LongTransactionCheckInterval)
	defer tick.Stop()
	const q = `SELECT pid, extract(epoch FROM now() - xact_start)::float8, coalesce(state, ''),
    coalesce(application_name, ''), left(coalesce(query, ''), 200)
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
    AND xact_start < now() - make_interval(secs => $1)
    AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
ORDER BY xact_start LIMIT 5`
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rows, err := t.sqlDB.QueryContext(qctx, q, t.cfg.LongTransactionWarning.Seconds())
		if err != nil {
			cancel()
			if ctx.Err() == nil {
				t.log.Debug("postgres transport: long-transaction check failed", "error", err)
			}
			continue
		}
		for rows.Next() {
			var (
				pid               int
				age               float64
				state, app, query string
			)
			if rows.Scan(&pid, &age, &state, &app, &query) != nil {
				continue
			}
			t.log.Warn("postgres transport: a long-running transaction holds back cleanup of acknowledged queue rows; delivery continues but claims slow down until it ends",
				"age", (time.Duration(age * float64(time.Second))).Round(time.Millisecond).String(), "pid", pid, "state", state,
				"application_name", app, "query", query, "table", t.n.messages)
		}
		_ = rows.Close()
		cancel()
	}
}

func advisoryKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// DeliverMandatory is Deliver where a message to an exchange no queue is
// bound to fails (wrapping transport.ErrUnroutable) instead of writing no
// row. Dead letters use it.
func (t *Transport) DeliverMandatory(ctx context.Context, msgs []*outbox.Message) []error {
	ctx, cancel := context.WithTimeout(ctx, t.deliverTimeout)
	defer cancel()
	errs := make([]error, len(msgs))
	var rest []*outbox.Message
	var at []int
	for i, m := range msgs {
		if kind, name := wire.ParseDestination(m.Destination); kind == "exchange" {
			var bound bool
			err := t.sqlDB.QueryRowContext(ctx, t.n.expand(`SELECT EXISTS (SELECT 1 FROM {bindings} WHERE exchange = $1)`), name).Scan(&bound)
			if err != nil {
				errs[i] = fmt.Errorf("postgres transport: look up the bindings of exchange %q: %w", name, err)
				continue
			}
			if !bound {
				errs[i] = fmt.Errorf("postgres transport: message %q to exchange %q reached no queue: %w", m.MessageID, name, transport.ErrUnroutable)
				continue
			}
		}
		rest = append(rest, m)
		at = append(at, i)
	}
	for k, err := range t.Deliver(ctx, rest) {
		errs[at[k]] = err
	}
	return errs
}

// noQueueError is the error of a send to an undeclared queue: it matches
// ErrNoQueue and transport.ErrUnroutable (a request to it fails as
// unconsumed; a response to a reply queue that is gone is dropped).
type noQueueError struct{ msg string }

func (e *noQueueError) Error() string   { return e.msg }
func (e *noQueueError) Unwrap() []error { return []error{ErrNoQueue, transport.ErrUnroutable} }
