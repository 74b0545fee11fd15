package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// baselinePipe is the yardstick: the same pipeline written by hand on pgx
// and amqp091 only, small enough to be obviously correct.
//
//   - Producer: the business row and the outbox row go in one pgx.Batch,
//     which pgx sends as one pipeline ending in a single Sync, so PostgreSQL
//     runs both statements as one implicit transaction: one round trip, one
//     commit. An in-process signal wakes the relay afterwards.
//   - Relay: each worker, in a transaction, selects a batch of pending rows
//     FOR UPDATE SKIP LOCKED, publishes them all on its confirm-mode channel
//     before waiting for any confirm, marks the confirmed batch delivered and
//     commits. A crash anywhere before the commit leaves the rows pending (a
//     duplicate the inbox absorbs, never a loss).
//   - Consumer: one statement inserts the inbox row (ON CONFLICT DO NOTHING)
//     and, only if it was new, the business row; it autocommits (one round
//     trip, one commit), then the delivery is acked. Manual acks, prefetch.
type baselinePipe struct {
	cfg *config
	env *env
	tr  *tracker

	pool *pgxpool.Pool
	conn *amqp.Connection

	tag, exchange, queue, outbox, inbox, orders, effects string
	claimSQL, markSQL, consumeSQL, produceSQL, orderSQL  string

	// noConsumers leaves the queue to someone else (relay-only runs).
	noConsumers bool

	wake   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errMu  sync.Mutex
	errs   []error
}

const baselineBatch = 100

func newBaseline(cfg *config, e *env, tr *tracker, label string) *baselinePipe {
	p := &baselinePipe{cfg: cfg, env: e, tr: tr}
	p.tag = e.name(label)
	p.exchange = "BenchOrder." + p.tag
	p.queue = p.tag + ".q"
	p.outbox = p.tag + "_outbox"
	p.inbox = p.tag + "_inbox"
	p.orders = p.tag + "_orders"
	p.effects = p.tag + "_effects"
	p.orderSQL = `INSERT INTO ` + p.orders + ` (message_id, amount) VALUES ($1, $2)`
	p.produceSQL = `INSERT INTO ` + p.outbox + ` (message_id, destination, payload) VALUES ($1, $2, $3)`
	p.claimSQL = `SELECT id, message_id, payload FROM ` + p.outbox + ` WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	p.markSQL = `UPDATE ` + p.outbox + ` SET status = 'delivered', delivered_at = now() WHERE id = ANY($1)`
	p.consumeSQL = `WITH ins AS (INSERT INTO ` + p.inbox + ` (message_id, consumer) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING message_id)
INSERT INTO ` + p.effects + ` (message_id, amount) SELECT message_id, $3 FROM ins`
	p.wake = make(chan struct{}, 1)
	return p
}

func (p *baselinePipe) Name() string { return "baseline" }

func (p *baselinePipe) fail(err error) {
	p.errMu.Lock()
	p.errs = append(p.errs, err)
	p.errMu.Unlock()
}

func (p *baselinePipe) Start(ctx context.Context) error {
	if err := p.prepare(ctx); err != nil {
		return err
	}
	return p.start(ctx)
}

// prepare connects and creates the tables, queue and exchange.
func (p *baselinePipe) prepare(ctx context.Context) error {
	p.env.addTables(p.outbox, p.inbox, p.orders, p.effects)
	p.env.addQueues(p.queue)
	p.env.addExchanges(p.exchange)
	pc, err := pgxpool.ParseConfig(p.env.dsn)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(p.cfg.producers + p.cfg.consumers + 4)
	p.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	ddl := append(businessDDL(p.orders, p.effects),
		`CREATE TABLE `+p.outbox+` (id bigserial PRIMARY KEY, message_id text NOT NULL, destination text NOT NULL,
  payload bytea NOT NULL, status text NOT NULL DEFAULT 'pending', created_at timestamptz NOT NULL DEFAULT now(), delivered_at timestamptz)`,
		`CREATE INDEX `+p.outbox+`_pending_idx ON `+p.outbox+` (id) WHERE status = 'pending'`,
		`CREATE TABLE `+p.inbox+` (message_id text NOT NULL, consumer text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (message_id, consumer))`)
	for _, q := range ddl {
		if _, err := p.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("baseline DDL: %w", err)
		}
	}
	p.conn, err = amqp.Dial(p.env.url)
	if err != nil {
		return err
	}
	return declareQueue(p.conn, p.exchange, p.queue)
}

// start starts the relay workers and the consumers.
func (p *baselinePipe) start(ctx context.Context) error {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	for range 2 { // as many relay workers as BareWire's default
		ch, err := p.conn.Channel()
		if err != nil {
			return err
		}
		if err := ch.Confirm(false); err != nil {
			return err
		}
		p.wg.Go(func() { p.relay(rctx, ch) })
	}
	for range p.cfg.consumers {
		if p.noConsumers {
			break
		}
		ch, err := p.conn.Channel()
		if err != nil {
			return err
		}
		if err := ch.Qos(2, 0, false); err != nil { // BareWire: prefetch 2×consumers over consumers channels
			return err
		}
		deliveries, err := ch.Consume(p.queue, "", false, false, false, false, nil)
		if err != nil {
			return err
		}
		p.wg.Go(func() { p.consume(rctx, ch, deliveries) })
	}
	return nil
}

func (p *baselinePipe) Produce(ctx context.Context, id string, m benchMsg) error {
	m.TS = time.Now().UnixNano()
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(p.orderSQL, id, m.Amount)
	b.Queue(p.produceSQL, id, p.exchange, body)
	if err := p.pool.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	p.tr.committed(id, time.Now())
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

func (p *baselinePipe) relay(ctx context.Context, ch *amqp.Channel) {
	defer ch.Close()
	for ctx.Err() == nil {
		n, err := p.relayOnce(ctx, ch)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.fail(fmt.Errorf("baseline relay: %w", err))
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if n > 0 {
			continue
		}
		select {
		case <-ctx.Done():
		case <-p.wake:
		case <-time.After(time.Second):
		}
	}
}

func (p *baselinePipe) relayOnce(ctx context.Context, ch *amqp.Channel) (int, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, p.claimSQL, baselineBatch)
	if err != nil {
		return 0, err
	}
	type row struct {
		id      int64
		msgID   string
		payload []byte
	}
	var batch []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.msgID, &r.payload); err != nil {
			rows.Close()
			return 0, err
		}
		batch = append(batch, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, nil
	}
	confirms := make([]*amqp.DeferredConfirmation, len(batch))
	for i, r := range batch {
		dc, err := ch.PublishWithDeferredConfirm(p.exchange, "", false, false, amqp.Publishing{
			MessageId: r.msgID, Type: p.exchange, ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: r.payload,
		})
		if err != nil {
			return 0, err
		}
		confirms[i] = dc
	}
	ids := make([]int64, 0, len(batch))
	for i, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, errors.New("broker nacked a publish")
		}
		ids = append(ids, batch[i].id)
	}
	if _, err := tx.Exec(ctx, p.markSQL, ids); err != nil {
		return 0, err
	}
	return len(batch), tx.Commit(ctx)
}

func (p *baselinePipe) consume(ctx context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery) {
	defer ch.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			var m benchMsg
			if err := json.Unmarshal(d.Body, &m); err != nil {
				p.fail(err)
				_ = d.Nack(false, false)
				continue
			}
			if _, err := p.pool.Exec(ctx, p.consumeSQL, d.MessageId, p.queue, m.Amount); err != nil {
				if ctx.Err() == nil {
					p.fail(fmt.Errorf("baseline consume: %w", err))
				}
				_ = d.Nack(false, true)
				continue
			}
			p.tr.consumedMsg(d.MessageId, m.TS, time.Now())
			if err := d.Ack(false); err != nil {
				p.fail(err)
			}
		}
	}
}

func (p *baselinePipe) Verify(ctx context.Context) (int64, int64, error) {
	var n, d int64
	err := p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+p.effects).Scan(&n, &d)
	return n, d, err
}

func (p *baselinePipe) Close(ctx context.Context) error {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	if p.conn != nil {
		_ = p.conn.Close()
	}
	if p.pool != nil {
		p.pool.Close()
	}
	p.errMu.Lock()
	defer p.errMu.Unlock()
	if len(p.errs) > 0 {
		return fmt.Errorf("%d baseline errors, first: %w", len(p.errs), p.errs[0])
	}
	return nil
}

// Diag reports where messages wait (outbox or broker queue).
func (p *baselinePipe) Diag(ctx context.Context) map[string]any {
	return waiting(ctx, p, p.outbox, p.env.url, p.queue, func(ctx context.Context, q string) (int64, error) {
		var n int64
		err := p.pool.QueryRow(ctx, q).Scan(&n)
		return n, err
	})
}
