//go:build watermillamqp

// This file needs github.com/ThreeDotsLabs/watermill-amqp/v3, which the
// module's go.mod does not require while nothing else imports it; build
// with the "watermillamqp" tag and a module file that adds it (make bench
// does both; see build.sh).

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
)

// forwarderPipe is Watermill's own outbox: the producer writes its message
// with the SQL publisher (watermill-sql v4, PostgreSQL) wrapped by the
// forwarder publisher inside its transaction; components/forwarder reads the
// SQL topic and republishes to RabbitMQ with watermill-amqp v3; a router
// handler consumes the queue and writes the same business row. Watermill
// has no inbox: the consumer writes only the business row.
type forwarderPipe struct {
	cfg  *config
	env  *env
	tr   *tracker
	mode fwdMode

	pool                                  *pgxpool.Pool
	fwd                                   *forwarder.Forwarder
	consumer                              *message.Router
	amqpPub                               *wamqp.Publisher
	amqpSub                               *wamqp.Subscriber
	sqlSub                                *wsql.Subscriber
	schema                                wsql.DefaultPostgreSQLSchema
	tag, fwdTopic, queue, orders, effects string
	cancel                                context.CancelFunc
	wg                                    sync.WaitGroup
}

const forwarderBuilt = true

var errNoForwarderBuild = errors.New("unreachable: the forwarder is built in")

func newForwarder(cfg *config, e *env, tr *tracker, label string, mode fwdMode) pipeline {
	p := &forwarderPipe{cfg: cfg, env: e, tr: tr, mode: mode}
	p.tag = e.name(label)
	p.fwdTopic = p.tag + "_fwd"
	p.queue = p.tag + ".q"
	p.orders = p.tag + "_orders"
	p.effects = p.tag + "_effects"
	return p
}

func (p *forwarderPipe) Name() string { return "watermill-forwarder " + p.mode.String() }

func (p *forwarderPipe) Start(ctx context.Context) error {
	p.env.addTables(p.orders, p.effects, "watermill_"+p.fwdTopic, "watermill_offsets_"+p.fwdTopic)
	p.env.addQueues(p.queue)
	pc, err := pgxpool.ParseConfig(p.env.dsn)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(p.cfg.producers + p.cfg.consumers + 4)
	p.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	for _, q := range businessDDL(p.orders, p.effects) {
		if _, err := p.pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	logger := watermill.NopLogger{}

	subCfg := wsql.SubscriberConfig{
		SchemaAdapter:    p.schema,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}
	if p.mode != fwdDefaults {
		subCfg.PollInterval = 10 * time.Millisecond
	}
	p.sqlSub, err = wsql.NewSubscriber(wsql.BeginnerFromPgx(p.pool), subCfg, logger)
	if err != nil {
		return err
	}
	if err := p.sqlSub.SubscribeInitialize(p.fwdTopic); err != nil {
		return err
	}

	amqpCfg := wamqp.NewDurableQueueConfig(p.env.url)
	handlers := 1
	if p.mode != fwdDefaults {
		amqpCfg.Publish.ChannelPoolSize = 1 // default 0 opens a channel per Publish
		amqpCfg.Consume.Qos.PrefetchCount = 2
		handlers = p.cfg.consumers
	}
	if p.mode == fwdTunedConfirms {
		// What an outbox needs to know the broker has the message; off by
		// default, and then each publish waits for its own confirm.
		amqpCfg.Publish.ConfirmDelivery = true
	}
	p.amqpPub, err = wamqp.NewPublisher(amqpCfg, logger)
	if err != nil {
		return err
	}
	p.amqpSub, err = wamqp.NewSubscriber(amqpCfg, logger)
	if err != nil {
		return err
	}
	if err := p.amqpSub.SubscribeInitialize(p.queue); err != nil {
		return err
	}

	p.fwd, err = forwarder.NewForwarder(p.sqlSub, p.amqpPub, logger, forwarder.Config{ForwarderTopic: p.fwdTopic})
	if err != nil {
		return err
	}
	p.consumer, err = message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return err
	}
	for i := range handlers {
		p.consumer.AddConsumerHandler(fmt.Sprintf("consume-%d", i), p.queue, p.amqpSub, p.handle)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	p.wg.Go(func() { _ = p.fwd.Run(rctx) })
	p.wg.Go(func() { _ = p.consumer.Run(rctx) })
	<-p.fwd.Running()
	<-p.consumer.Running()
	return nil
}

func (p *forwarderPipe) handle(msg *message.Message) error {
	var m benchMsg
	if err := json.Unmarshal(msg.Payload, &m); err != nil {
		return err
	}
	ctx := msg.Context()
	if _, err := p.pool.Exec(ctx, `INSERT INTO `+p.effects+` (message_id, amount) VALUES ($1, $2)`, msg.UUID, m.Amount); err != nil {
		return err
	}
	p.tr.consumedMsg(msg.UUID, m.TS, time.Now())
	return nil
}

func (p *forwarderPipe) Produce(ctx context.Context, id string, m benchMsg) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `INSERT INTO `+p.orders+` (message_id, amount) VALUES ($1, $2)`, id, m.Amount); err != nil {
		return err
	}
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: p.schema}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	m.TS = time.Now().UnixNano()
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	msg := message.NewMessage(id, body)
	msg.SetContext(ctx)
	if err := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: p.fwdTopic}).Publish(p.queue, msg); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	p.tr.committed(id, time.Now())
	return nil
}

func (p *forwarderPipe) Verify(ctx context.Context) (int64, int64, error) {
	var n, d int64
	err := p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+p.effects).Scan(&n, &d)
	return n, d, err
}

func (p *forwarderPipe) Close(ctx context.Context) error {
	var errs []error
	if p.fwd != nil {
		errs = append(errs, p.fwd.Close())
	}
	if p.consumer != nil {
		errs = append(errs, p.consumer.Close())
	}
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	if p.amqpPub != nil {
		errs = append(errs, p.amqpPub.Close())
	}
	if p.amqpSub != nil {
		errs = append(errs, p.amqpSub.Close())
	}
	if p.sqlSub != nil {
		errs = append(errs, p.sqlSub.Close())
	}
	if p.pool != nil {
		p.pool.Close()
	}
	return joinErrs(errs...)
}
