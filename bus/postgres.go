package bus

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/pgtransport"
	"github.com/barewire-go/barewire/outbox"
)

// PostgresTransport configures the PostgreSQL transport: the receive
// endpoints (declared exactly as on any other transport, through the
// embedded Endpoints) and the transport's own settings. Zero fields take
// the defaults written on each.
type PostgresTransport struct {
	endpoint.Endpoints

	// TablePrefix prefixes the transport's tables (<prefix>queue_messages,
	// <prefix>queues, <prefix>bindings). Letters, digits and underscores.
	// Defaults to "barewire_".
	TablePrefix string
	// PollInterval is the safety-net poll of an idle consumer; a
	// PostgreSQL NOTIFY sent when a message commits wakes it at once.
	// Defaults to 1s.
	PollInterval time.Duration
	// Lease is how long a claimed message stays invisible to other
	// consumers; it is extended while the handler runs, so it only bounds
	// how soon the message of a crashed process is redelivered. Defaults
	// to 30s.
	Lease time.Duration
	// RedeliveryDelay is how long a nacked message waits before any
	// consumer may take it again; the messages behind it are not held up.
	// Defaults to 100ms; negative means at once.
	RedeliveryDelay time.Duration
	// LongTransactionWarning logs a warning, with its age, for every
	// transaction open longer than this on the database: it holds back
	// the cleanup of acknowledged rows, which slows delivery. Defaults to
	// 1 minute; negative disables the check.
	LongTransactionWarning time.Duration
	// DisableAutoMigrate stops Start from creating the transport's tables;
	// apply pgtransport's MigrationSQL with your own tool.
	DisableAutoMigrate bool
}

func (p *PostgresTransport) config() pgtransport.Config {
	return pgtransport.Config{
		TablePrefix:            p.TablePrefix,
		PollInterval:           p.PollInterval,
		Lease:                  p.Lease,
		RedeliveryDelay:        p.RedeliveryDelay,
		LongTransactionWarning: p.LongTransactionWarning,
		DisableAutoMigrate:     p.DisableAutoMigrate,
	}
}

// WithPostgresTransport selects PostgreSQL as the transport, for
// deployments with no message broker: endpoint queues are tables in db
// (see docs/transports.md). configure declares the receive endpoints and
// sets the transport's options.
//
// Unless WithOutbox (or WithSQLite) chooses another database, the inbox and
// the outbox live in db too; then a message published inside a transaction
// on db can be written straight to its queues in that transaction.
//
// Give one transport option: WithPostgresTransport and WithRabbitMQ exclude
// each other.
func WithPostgresTransport(db *gorm.DB, configure func(p *PostgresTransport)) Option {
	return func(c *config) error {
		if db == nil || db.Config == nil || db.Dialector == nil {
			return optErr("WithPostgresTransport: db is nil; pass a *gorm.DB opened with gorm.io/driver/postgres (gormstore.OpenPostgres)")
		}
		if name := db.Dialector.Name(); name != gormstore.DialectPostgres {
			return optErr("WithPostgresTransport: db is %q; the PostgreSQL transport needs a PostgreSQL database", name)
		}
		switch c.transport {
		case transportPostgres:
			return optErr("WithPostgresTransport given twice")
		case transportRabbitMQ:
			return optErr("WithPostgresTransport and WithRabbitMQ both choose a transport; keep one")
		}
		p := &PostgresTransport{}
		if configure != nil {
			configure(p)
		}
		c.transport = transportPostgres
		c.endpoints = append(c.endpoints, &p.Endpoints)
		for _, err := range p.config().Validate() {
			c.errs = append(c.errs, fmt.Errorf("%w: %w", ErrInvalidOption, err))
		}
		pgSetups.put(c, &pgSetup{db: db, p: p})
		return nil
	}
}

// usePostgres is New's case for the PostgreSQL transport: it builds the
// transport and, unless another database was chosen, keeps the inbox and
// outbox in the transport's database.
func (b *Bus) usePostgres(c *config) []error {
	s := pgSetups.take(c)
	if s == nil {
		return []error{optErr("PostgreSQL transport settings missing (internal error)")}
	}
	cfg := s.p.config()
	// Messages written in the caller's transaction count as published
	// once the transport sees that transaction commit.
	cfg.OnCommitted = func(msgs []*outbox.Message) { b.obs.delivered(msgs, false) }
	tr, err := pgtransport.New(s.db, cfg, c.logger)
	if err != nil {
		return []error{fmt.Errorf("%w: %w", ErrInvalidOption, err)}
	}
	b.tr = tr
	if c.db == nil && c.sqlitePath == "" {
		c.db = s.db
	}
	return nil
}

type pgSetup struct {
	db *gorm.DB
	p  *PostgresTransport
}

// pgSetups carries the option's settings from WithPostgresTransport to
// New's transport switch. Entries are keyed weakly by the config New
// builds and removed by New (or, should New not reach the switch case, when
// the config is collected).
var pgSetups = &setupTable{m: map[weak.Pointer[config]]*pgSetup{}}

type setupTable struct {
	mu sync.Mutex
	m  map[weak.Pointer[config]]*pgSetup
}

func (t *setupTable) put(c *config, s *pgSetup) {
	k := weak.Make(c)
	t.mu.Lock()
	_, had := t.m[k]
	t.m[k] = s
	t.mu.Unlock()
	if !had {
		runtime.AddCleanup(c, func(k weak.Pointer[config]) {
			t.mu.Lock()
			delete(t.m, k)
			t.mu.Unlock()
		}, k)
	}
}

func (t *setupTable) take(c *config) *pgSetup {
	k := weak.Make(c)
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[k]
	delete(t.m, k)
	return s
}

// txDeliverer is implemented by transports that can write messages in the
// caller's database transaction, so that publishing from a transaction
// needs no outbox row and no relay hop: the PostgreSQL transport, when the
// transaction is on its database.
type txDeliverer interface {
	// DeliverTx writes msgs in the transaction carried by ctx
	// (gormstore.WithTx). They become visible when it commits.
	DeliverTx(ctx context.Context, msgs []*outbox.Message) error
}

var _ txDeliverer = (*pgtransport.Transport)(nil)

// txAcker is implemented by transports that can acknowledge a delivery in
// the transaction that commits the consumer's effects (the PostgreSQL
// transport, when the inbox is on its database): the message is then
// acknowledged if and only if the effects commit.
type txAcker interface {
	// AckTx acknowledges msg in the transaction carried by ctx and
	// reports whether it did.
	AckTx(ctx context.Context, msg *message.Message) (bool, error)
	// AckedInTx is called once that transaction has committed.
	AckedInTx(msg *message.Message)
}

var _ txAcker = (*pgtransport.Transport)(nil)

// deliverInTx writes m in tx through the transport when the transport can
// (see txDeliverer). done is false when the caller must use the outbox: the
// transport cannot write in transactions, tx is on another database, or the
// transport is closed.
func (b *Bus) deliverInTx(ctx context.Context, tx *gorm.DB, m *outbox.Message) (done bool, err error) {
	td, ok := b.tr.(txDeliverer)
	if !ok {
		return false, nil
	}
	err = td.DeliverTx(gormstore.WithTx(ctx, tx), []*outbox.Message{m})
	if errors.Is(err, pgtransport.ErrNotSameDatabase) || errors.Is(err, outbox.ErrTransportUnavailable) {
		return false, nil
	}
	return true, err
}
