package main

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/inproc"
)

// embeddedPipe is the embedded default: bus.New with no transport and no
// database options (in-memory SQLite, in-process transport), the same
// producer transaction and the same consumer with the inbox.
//
// The bus owns the SQLite connection, so the consumer's commit instant is
// taken at the end of the handler, just before the commit (an in-memory
// SQLite commit takes microseconds).
type embeddedPipe struct {
	cfg *config
	tr  *tracker
	b   *bus.Bus

	typ, queue string
}

func newEmbedded(cfg *config, e *env, tr *tracker) *embeddedPipe {
	tag := e.name("emb")
	return &embeddedPipe{cfg: cfg, tr: tr, typ: "BenchOrder." + tag, queue: tag + ".q"}
}

func (p *embeddedPipe) Name() string { return "embedded" }

func (p *embeddedPipe) Start(ctx context.Context) error {
	b, err := bus.New(
		bus.WithLogger(benchLogger()),
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint(p.queue, func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = p.cfg.consumers
				e.PrefetchCount = p.cfg.prefetch * p.cfg.consumers
				endpoint.Consumer(e, p.consume, endpoint.AsMessageType(p.typ))
			})
		})),
	)
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	p.b = b
	for _, ddl := range []string{
		`CREATE TABLE orders (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, amount INTEGER NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`,
		`CREATE TABLE effects (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, amount INTEGER NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`,
	} {
		if err := b.DB().WithContext(ctx).Exec(ddl).Error; err != nil {
			return err
		}
	}
	return nil
}

func (p *embeddedPipe) consume(ctx context.Context, c *endpoint.Context[benchMsg]) error {
	tx := bus.TxFromContext(ctx)
	if err := tx.Exec("INSERT INTO effects (message_id, amount) VALUES (?, ?)", c.MessageID, c.Message.Amount).Error; err != nil {
		return err
	}
	p.tr.consumedMsg(c.MessageID, c.Message.TS, time.Now())
	return nil
}

func (p *embeddedPipe) Produce(ctx context.Context, id string, m benchMsg) error {
	h := bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: p.typ}
	err := p.b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := tx.Exec("INSERT INTO orders (message_id, amount) VALUES (?, ?)", id, m.Amount).Error; err != nil {
			return err
		}
		m.TS = time.Now().UnixNano()
		return p.b.PublishTx(ctx, tx, m, h)
	})
	if err != nil {
		return err
	}
	p.tr.committed(id, time.Now())
	return nil
}

func (p *embeddedPipe) Verify(ctx context.Context) (int64, int64, error) {
	var r struct{ N, D int64 }
	err := p.b.DB().WithContext(ctx).Raw("SELECT count(*) AS n, count(DISTINCT message_id) AS d FROM effects").Scan(&r).Error
	return r.N, r.D, err
}

func (p *embeddedPipe) Close(ctx context.Context) error {
	if p.b == nil {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return p.b.Stop(sctx)
}
