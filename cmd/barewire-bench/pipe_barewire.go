package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// barewirePipe is the pipeline under test: BareWire on PostgreSQL and
// RabbitMQ. The producer commits a business row and PublishTx in one
// b.Transaction; the relay sends the outbox row to RabbitMQ; an endpoint
// with the inbox writes one business row per message in the inbox's
// transaction.
type barewirePipe struct {
	cfg   *config
	env   *env
	tr    *tracker
	label string

	inbox      endpoint.InboxMode
	outboxOpts func(*outbox.Options)
	// plainTx produces with db.Transaction instead of b.Transaction: no
	// in-process wake after commit, so the relay is woken by PostgreSQL
	// NOTIFY (or its re-checks), as for a commit made by another process.
	plainTx bool
	// noConsumer leaves the queue without an endpoint (relay-only runs).
	noConsumer bool
	// pgTransport runs the bus on the PostgreSQL transport in the same
	// database instead of RabbitMQ: PublishTx writes the message to the
	// queue table in the producer's transaction (no outbox row, no relay).
	pgTransport bool
	// wm names the Watermill preset (wmamqp, wmnats, wmredis) the bus runs
	// on instead of transport/rabbitmq (see pipe_watermill.go).
	wm string
	// cluster runs the bus on the RabbitMQ cluster of -cluster, every
	// endpoint on a quorum queue (rabbitmq.Config.QueueType).
	cluster bool
	// partitions > 0 makes the endpoint Ordered(partitions) and gives
	// every message one of keys ordering keys (ordering.go).
	partitions, keys int

	db                                       *gorm.DB
	b                                        *bus.Bus
	tag, typ, queue, prefix, orders, effects string
}

func newBareWire(cfg *config, e *env, tr *tracker, label string) *barewirePipe {
	p := &barewirePipe{cfg: cfg, env: e, tr: tr, label: label, inbox: cfg.inbox}
	p.tag = e.name(label)
	p.prefix = p.tag + "_"
	p.orders = p.tag + "_orders"
	p.effects = p.tag + "_effects"
	p.typ = "BenchOrder." + p.tag
	p.queue = p.tag + ".q"
	return p
}

// newPGTransport is the same pipeline on the PostgreSQL transport: the
// queue is a table next to the business tables, the inbox and the outbox.
func newPGTransport(cfg *config, e *env, tr *tracker, label string) *barewirePipe {
	p := newBareWire(cfg, e, tr, label)
	p.pgTransport = true
	return p
}

// newCluster is the e2e pipeline on the RabbitMQ cluster, with a quorum
// queue.
func newCluster(cfg *config, e *env, tr *tracker, label string) *barewirePipe {
	p := newBareWire(cfg, e, tr, label)
	p.cluster = true
	return p
}

func (p *barewirePipe) Name() string {
	if p.pgTransport {
		return "barewire-pg-transport"
	}
	if p.wm != "" {
		return "barewire-" + p.wm
	}
	if p.cluster {
		return "barewire-cluster-quorum"
	}
	return "barewire"
}

func benchLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// prepare opens the database and creates the business tables; Start calls
// it, and the backlog scenario calls it before filling the outbox.
func (p *barewirePipe) prepare(ctx context.Context) error {
	if p.db != nil {
		return nil
	}
	p.env.addTables(p.prefix+"inbox", p.prefix+"outbox", p.orders, p.effects)
	if p.pgTransport {
		p.env.addTables(p.prefix+"queue_messages", p.prefix+"queues", p.prefix+"bindings")
	} else if p.cluster {
		p.env.addClusterTopology([]string{p.queue, p.queue + "_error"}, []string{p.typ})
	} else {
		p.env.addQueues(p.queue, p.queue+"_error")
		p.env.addExchanges(p.typ)
		for i := range p.partitions {
			p.env.addQueues(fmt.Sprintf("%s.p%d", p.queue, i))
		}
		if p.partitions > 0 {
			p.env.addExchanges(p.queue+".ordered", p.queue+".unkeyed")
		}
	}
	db, err := openHookedPostgres(p.env.dsn, p.cfg.producers+p.cfg.consumers+8)
	if err != nil {
		return err
	}
	p.db = db
	for _, ddl := range businessDDL(p.orders, p.effects) {
		if err := db.WithContext(ctx).Exec(ddl).Error; err != nil {
			return err
		}
	}
	return nil
}

// configure sets up the pipeline's receive endpoint from the flags
// (-consumers, -prefetch, -inbox, -batch) and the scenario (partitions).
func (p *barewirePipe) configure(e *endpoint.Endpoint) {
	consumers := p.cfg.consumers
	e.ConcurrentMessageLimit = consumers
	e.PrefetchCount = p.cfg.prefetch * consumers // RabbitMQ only; the PostgreSQL transport claims one row per consumer
	e.Inbox = p.inbox
	if p.cfg.batch > 0 {
		e.Batch.MaxMessages = p.cfg.batch
	}
	if p.partitions > 0 {
		e.Ordered(p.partitions)
	}
	endpoint.Consumer(e, p.consume, endpoint.AsMessageType(p.typ))
}

func (p *barewirePipe) options() []bus.Option {
	declare := func(c *endpoint.Endpoints) {
		if p.noConsumer {
			return
		}
		c.ReceiveEndpoint(p.queue, p.configure)
	}
	opts := []bus.Option{
		bus.WithLogger(benchLogger()),
		bus.WithInstanceID("barewire-bench-" + p.tag),
		// The same *gorm.DB for the outbox and (on the PostgreSQL
		// transport) the transport: PublishTx then writes to the queue.
		bus.WithDatabase(p.db),
		bus.WithOutbox(func(o *outbox.Options) {
			o.TablePrefix = p.prefix
			if p.cfg.relayWorkers > 0 {
				o.RelayWorkers = p.cfg.relayWorkers
			}
			if p.outboxOpts != nil {
				p.outboxOpts(o)
			}
		}),
	}
	if p.pgTransport {
		return append(opts, bus.WithTransport(pgtransport.New(p.db, func(c *pgtransport.Config) {
			c.TablePrefix = p.prefix
			declare(&c.Endpoints)
		})))
	}
	if p.wm != "" {
		return append(opts, bus.WithTransport(p.wmFactory(declare)))
	}
	if p.cluster {
		return append(opts, bus.WithTransport(rabbitmq.New(p.env.cluster, func(c *rabbitmq.Config) {
			c.QueueType = endpoint.Quorum
			declare(&c.Endpoints)
		})))
	}
	return append(opts, bus.WithTransport(rabbitmq.New(p.env.url, func(c *rabbitmq.Config) { declare(&c.Endpoints) })))
}

func (p *barewirePipe) Start(ctx context.Context) error {
	if err := p.prepare(ctx); err != nil {
		return err
	}
	b, err := bus.New(p.options()...)
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	p.b = b
	return nil
}

// consume is the endpoint's consumer: one business row in the bus's
// transaction; the tracker hears of it once that transaction commits.
func (p *barewirePipe) consume(ctx context.Context, c *endpoint.Context[benchMsg]) error {
	started := time.Now()
	tx := bus.TxFromContext(ctx)
	if err := tx.Exec("INSERT INTO "+p.effects+" (message_id, amount) VALUES (?, ?)", c.MessageID, c.Message.Amount).Error; err != nil {
		return err
	}
	id, ts := c.MessageID, c.Message.TS
	switch d := gormstore.DeferredOf(tx); {
	case afterCommit(tx, func(at time.Time) { p.tr.consumedMsgStaged(id, ts, started, at) }):
	case d != nil: // the inbox's pipelined transaction (PostgreSQL with the Pipeline plugin)
		d.AfterCommit(func() { p.tr.consumedMsgStaged(id, ts, started, time.Now()) })
	default:
		p.tr.consumedMsgStaged(id, ts, started, time.Now())
	}
	return nil
}

func (p *barewirePipe) Produce(ctx context.Context, id string, m benchMsg) error {
	h := p.orderingKey(id, bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: p.typ})
	hooked := false
	fn := func(tx *gorm.DB) error {
		if err := tx.Exec("INSERT INTO "+p.orders+" (message_id, amount) VALUES (?, ?)", id, m.Amount).Error; err != nil {
			return err
		}
		m.TS = time.Now().UnixNano()
		if err := p.b.PublishTx(ctx, tx, m, h); err != nil {
			return err
		}
		hooked = afterCommit(tx, func(at time.Time) { p.tr.committed(id, at) })
		if !hooked && gormstore.DeferredOf(tx) == nil {
			return fmt.Errorf("transaction is not hooked")
		}
		return nil
	}
	if p.plainTx {
		return p.db.WithContext(ctx).Transaction(fn)
	}
	err := p.b.Transaction(ctx, fn)
	if err == nil && !hooked {
		// b.Transaction's pipelined commit (postgresdb.Pipeline) runs on a
		// connection of the *sql.DB, not a hookTx: the commit returned
		// just now.
		p.tr.committed(id, time.Now())
	}
	return err
}

func (p *barewirePipe) Verify(ctx context.Context) (int64, int64, error) {
	var r struct{ N, D int64 }
	err := p.db.WithContext(ctx).Raw("SELECT count(*) AS n, count(DISTINCT message_id) AS d FROM " + p.effects).Scan(&r).Error
	return r.N, r.D, err
}

func (p *barewirePipe) Close(ctx context.Context) error {
	var errs []error
	if p.b != nil {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		errs = append(errs, p.b.Stop(sctx))
		cancel()
	}
	if p.db != nil {
		if sqlDB, err := p.db.DB(); err == nil {
			errs = append(errs, sqlDB.Close())
		}
	}
	return joinErrs(errs...)
}

// Diag reports where messages wait (outbox or broker queue; on the
// PostgreSQL transport, the queue table).
func (p *barewirePipe) Diag(ctx context.Context) map[string]any {
	d := p.diag(ctx)
	// Group commit since the bus started (warm-up included): transactions
	// and the mean messages per transaction (bus.Stats).
	if st := p.b.Stats(); st.Batches > 0 {
		d["group_commit_batches"] = st.Batches
		d["group_commit_mean_batch"] = math.Round(float64(st.BatchedMessages)/float64(st.Batches)*100) / 100
	}
	return d
}

func (p *barewirePipe) diag(ctx context.Context) map[string]any {
	if p.pgTransport {
		d := map[string]any{}
		for k, q := range map[string]string{
			"outbox_pending_at_window_end":    "SELECT count(*) FROM " + p.prefix + "outbox WHERE status = 'pending'",
			"queue_rows_at_window_end":        "SELECT count(*) FROM " + p.prefix + "queue_messages WHERE queue = '" + p.queue + "'",
			"outbox_rows_written_by_producer": "SELECT count(*) FROM " + p.prefix + "outbox",
		} {
			var n int64
			if err := p.db.WithContext(ctx).Raw(q).Scan(&n).Error; err == nil {
				d[k] = n
			}
		}
		return d
	}
	url := p.env.url
	if p.cluster {
		url, _, _ = strings.Cut(p.env.cluster, ",") // queue depth on node 1 (any node answers for a quorum queue)
	}
	return waiting(ctx, p, p.prefix+"outbox", url, p.queue, func(ctx context.Context, q string) (int64, error) {
		var n int64
		err := p.db.WithContext(ctx).Raw(q).Scan(&n).Error
		return n, err
	})
}
