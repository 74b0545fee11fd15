package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// scheduledScenario measures scheduled delivery's precision on RabbitMQ and
// PostgreSQL: -scheduled-msgs messages are published with bus.Delay spread
// over 0.5–10.5 s while -future-rows rows wait an hour or more ahead in the
// same outbox, and each message's lateness (consumed − due, both on this
// host's clock; the due time is the publish's start plus the delay) is
// reported as p50/p99/max.
func (r *runner) scheduledScenario(ctx context.Context) error {
	prefix := r.env.name("sch") + "_"
	queue, typ := r.env.name("sch_q"), r.env.name("sch_t")
	r.env.addTables(prefix+"inbox", prefix+"outbox")
	r.env.addQueues(queue, queue+"_error")
	r.env.addExchanges(typ)

	db, err := postgresdb.Open(r.env.dsn)
	if err != nil {
		return err
	}
	defer func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	}()
	n := r.cfg.scheduled
	var mu sync.Mutex
	late := make([]float64, 0, n)
	seen := map[string]int{}
	all := make(chan struct{})
	b, err := bus.New(
		bus.WithLogger(benchLogger()),
		bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }),
		bus.WithTransport(rabbitmq.New(r.env.url, func(c *rabbitmq.Config) {
			c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = 8
				endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
					at := time.Now()
					if len(d.Body) != 8 {
						return errors.New("body is not a due time")
					}
					due := time.Unix(0, int64(binary.BigEndian.Uint64(d.Body)))
					mu.Lock()
					defer mu.Unlock()
					seen[d.MessageID]++
					if seen[d.MessageID] == 1 {
						late = append(late, float64(at.Sub(due).Microseconds())/1000)
						if len(late) == n {
							close(all)
						}
					}
					return nil
				}, endpoint.ForTypes(typ))
			})
		})),
	)
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = b.Stop(context.WithoutCancel(ctx)) }()

	pool, err := pgxpool.New(ctx, r.env.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	t0 := time.Now()
	// The backlog: rows an hour or more ahead, with the lowest ids.
	if _, err := pool.Exec(ctx, `INSERT INTO `+quoteIdent(prefix+"outbox")+` (message_id, destination, message_type, payload, available_at)
SELECT 'future-' || g, 'queue:'||$1::text, $2::text, '\x0000000000000000', now() + interval '1 hour' + g * interval '10 ms'
FROM generate_series(1, $3::int) AS g`, queue, typ, r.cfg.future); err != nil {
		return fmt.Errorf("fill future rows: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+quoteIdent(prefix+"outbox")); err != nil {
		return err
	}
	logf("   scheduled: %d future rows in %.1fs", r.cfg.future, time.Since(t0).Seconds())

	began := time.Now()
	for i := range n {
		delay := 500*time.Millisecond + time.Duration(i)*10*time.Second/time.Duration(n)
		due := time.Now().Add(delay)
		body := binary.BigEndian.AppendUint64(nil, uint64(due.UnixNano()))
		if err := b.Send(ctx, queue, bus.Raw{Type: typ, Body: body}, bus.Delay(delay, bus.Headers{bus.HeaderMessageID: fmt.Sprintf("sch-%s-%d", r.env.suffix, i)})); err != nil {
			return fmt.Errorf("schedule %d: %w", i, err)
		}
	}
	published := time.Since(began)
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		mu.Lock()
		got := len(late)
		mu.Unlock()
		return fmt.Errorf("only %d of %d scheduled messages arrived within 2 minutes after they were due", got, n)
	case <-ctx.Done():
		return ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	ps := percentiles(late, 50, 95, 99, 100)
	early := 0
	for _, l := range late {
		if l < 0 {
			early++
		}
	}
	dups := int64(0)
	for _, k := range seen {
		if k > 1 {
			dups += int64(k - 1)
		}
	}
	res := Result{
		Scenario: "scheduled", Variant: fmt.Sprintf("%d-future-rows", r.cfg.future),
		P50: ps[0], P95: ps[1], P99: ps[2], Max: ps[3], Samples: len(late),
		Produced: int64(n), Consumed: int64(len(late)), Duplicates: dups,
		RatioOf: "latency = consumed − due",
		Extra:   map[string]any{"future_rows": r.cfg.future, "arrived_early": early, "publish_s": published.Seconds()},
	}
	if early > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d messages arrived before their due time", early))
	}
	r.add(res)
	return nil
}
