package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// The saga scenario: an endpoint drains a preloaded queue of events, each
// moving one instance one step (n+1, version+1), either as a saga
// transition or as a plain consumer doing the same writes by hand (read the
// row, insert it or update it conditionally on its version, re-read on a
// lost race), in the inbox's transaction, on PostgreSQL and RabbitMQ.
// "spread": many instances, consecutive events for different ones;
// "contention": a few instances take all the events.

// sagaBenchEvent is one event for one instance.
type sagaBenchEvent struct {
	Instance string `json:"instance"`
	Seq      int    `json:"seq"`
}

// sagaBenchInstance is the saga's instance (and the plain consumer's row).
type sagaBenchInstance struct {
	saga.State
	N    int
	Last int
}

type sagaVariant struct {
	name  string // plain, saga, saga-pessimistic
	saga  bool
	pess  bool
	hot   bool // contention
	label string
}

func (r *runner) sagaScenario(ctx context.Context) error {
	variants := []sagaVariant{
		{name: "plain consumer", label: "spread"},
		{name: "saga optimistic", saga: true, label: "spread"},
		{name: "plain consumer", hot: true, label: "contention"},
		{name: "saga optimistic", saga: true, hot: true, label: "contention"},
		{name: "saga pessimistic", saga: true, pess: true, hot: true, label: "contention"},
	}
	// Each round runs the variants of a group forward, then backward
	// (ABBA), so that a drift in the machine's load touches all alike.
	var order []int
	for round := 0; round < max(r.cfg.rounds, 1); round++ {
		for _, g := range [][]int{{0, 1}, {2, 3, 4}} {
			order = append(order, g...)
			for i := len(g) - 1; i >= 0; i-- {
				order = append(order, g[i])
			}
		}
	}
	runs := make([][]Result, len(variants))
	for k, i := range order {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		v := variants[i]
		res, err := r.sagaRun(ctx, v, k)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", v.label, v.name, err)
		}
		logf("   %s %s: %.0f events/s, %.3f re-applies per event", v.label, v.name, res.MsgsPerS, res.Extra["reapplies_per_event"])
		runs[i] = append(runs[i], res)
		if err := r.env.cleanup(ctx); err != nil {
			logf("   cleanup: %v", err)
		}
	}
	// Each variant ran twice per round, once on each side of the plain
	// consumer's runs: its ratio is the median over the rounds of (its two
	// runs) / (the plain consumer's two runs), so that a load change
	// between rounds cancels out.
	plainOf := func(v sagaVariant) int {
		if v.hot {
			return 2
		}
		return 0
	}
	for i, v := range variants {
		res := runs[i][0]
		var rates, reapplies []float64
		for _, x := range runs[i] {
			rates = append(rates, x.MsgsPerS)
			reapplies = append(reapplies, x.Extra["reapplies_per_event"].(float64))
		}
		res.MsgsPerS = median(rates)
		res.Extra["reapplies_per_event"] = median(reapplies)
		res.Extra["runs_events_per_s"] = rates
		res.Notes = append(res.Notes, fmt.Sprintf("median of %d runs, ABBA order", len(rates)))
		p := runs[plainOf(v)]
		var ratios []float64
		for rd := 0; 2*rd+1 < len(runs[i]) && 2*rd+1 < len(p); rd++ {
			ratios = append(ratios, (runs[i][2*rd].MsgsPerS+runs[i][2*rd+1].MsgsPerS)/(p[2*rd].MsgsPerS+p[2*rd+1].MsgsPerS))
		}
		var plainRates []float64
		for _, x := range p {
			plainRates = append(plainRates, x.MsgsPerS)
		}
		res.BaselineMsgsPerS, res.RatioOf = median(plainRates), "plain consumer, same writes, same rounds (median of per-round ratios)"
		res.Ratio = median(ratios)
		res.Extra["round_ratios"] = ratios
		r.add(res)
	}
	return nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// sagaRun preloads the events, starts a bus whose endpoint applies them,
// and times the drain from the first event applied to the last.
func (r *runner) sagaRun(ctx context.Context, v sagaVariant, k int) (Result, error) {
	events, instances := r.cfg.sagaEvents, max(r.cfg.sagaEvents/4, 1)
	if v.hot {
		events, instances = r.cfg.sagaEvents/2, r.cfg.sagaHot
	}
	tag := r.env.name(fmt.Sprintf("saga%d", k))
	prefix, table, queue, typ := tag+"_", tag+"_inst", tag+".q", "SagaBench."+tag
	r.env.addTables(prefix+"inbox", prefix+"outbox", table)
	r.env.addQueues(queue, queue+"_error")
	r.env.addExchanges(typ)

	var attempts atomic.Int64
	m, err := saga.New("bench", func(m *saga.Machine[sagaBenchInstance]) {
		active := m.State("Active")
		ev := saga.NewEvent(m, func(e sagaBenchEvent) string { return e.Instance }, endpoint.AsMessageType(typ))
		step := func(ctx context.Context, c *saga.Context[sagaBenchInstance, sagaBenchEvent]) error {
			attempts.Add(1)
			c.Instance.N++
			c.Instance.Last = c.Message.Seq
			return nil
		}
		m.Initially(saga.When(ev).Then(step).TransitionTo(active))
		m.During(active, saga.When(ev).Then(step))
	}, saga.WithTable(table), func() saga.Option {
		if v.pess {
			return saga.Pessimistic()
		}
		return saga.MaxConflictRetries(20)
	}())
	if err != nil {
		return Result{}, err
	}
	db, err := openHookedPostgres(r.env.dsn, r.cfg.consumers+8)
	if err != nil {
		return Result{}, err
	}
	defer closeGorm(db)
	if err := saga.Migrate(ctx, db, m); err != nil {
		return Result{}, err
	}
	if err := preloadSagaEvents(r.env.url, typ, queue, events, instances); err != nil {
		return Result{}, fmt.Errorf("preload: %w", err)
	}
	plain := func(ctx context.Context, c *endpoint.Context[sagaBenchEvent]) error {
		return plainTransition(ctx, bus.TxFromContext(ctx), table, c.Message, &attempts)
	}
	b, err := bus.New(
		bus.WithLogger(benchLogger()),
		bus.WithInstanceID("barewire-bench-"+tag),
		bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }),
		bus.WithTransport(rabbitmq.New(r.env.url, func(c *rabbitmq.Config) {
			c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = r.cfg.consumers
				e.PrefetchCount = r.cfg.prefetch * r.cfg.consumers
				e.Inbox = r.cfg.inbox
				e.Retry = endpoint.Immediate(50)
				if v.saga {
					saga.Register(e, m)
				} else {
					endpoint.Consumer(e, plain, endpoint.AsMessageType(typ))
				}
			})
		})))
	if err != nil {
		return Result{}, err
	}
	if err := b.Start(ctx); err != nil {
		return Result{}, err
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = b.Stop(sctx)
		}
	}
	defer stop()

	limit := time.Now().Add(r.cfg.duration + r.cfg.drain)
	var t0 time.Time
	var c0 int64
	cpu0 := cpuTime()
	settled := func() int64 { s := b.Stats(); return s.Consumed + s.DeadLettered }
	for time.Now().Before(limit) && ctx.Err() == nil {
		c := settled()
		if t0.IsZero() && c > 0 {
			t0, c0, cpu0 = time.Now(), c, cpuTime()
		}
		if c >= int64(events) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	t1, c1, cpu1 := time.Now(), settled(), cpuTime()
	stop()
	res := Result{Scenario: "saga", Variant: v.label + "/" + v.name, Produced: int64(events), Consumed: c1,
		Consumers: r.cfg.consumers, LoadAvg1m: loadAvg(), Extra: map[string]any{"instances": instances}}
	if !t0.IsZero() && t1.After(t0) {
		res.MsgsPerS = float64(c1-c0) / t1.Sub(t0).Seconds()
		res.DurationS = t1.Sub(t0).Seconds()
		if c1 > c0 {
			res.CPUPerMsgUS = float64(cpu1-cpu0) / float64(time.Microsecond) / float64(c1-c0)
		}
	}
	res.Extra["reapplies_per_event"] = float64(attempts.Load()-int64(events)) / float64(events)
	if s := b.Stats(); s.DeadLettered > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d events dead-lettered", s.DeadLettered))
	}
	// Every event applied once: the counters add up to the events.
	var sum struct{ N, Rows int64 }
	if err := db.WithContext(ctx).Table(table).Select("COALESCE(SUM(n), 0) AS n, COUNT(*) AS rows").Scan(&sum).Error; err != nil {
		return res, err
	}
	if sum.N != int64(events) || sum.Rows != int64(instances) {
		res.Notes = append(res.Notes, fmt.Sprintf("CHECK FAILED: %d transitions over %d instances, want %d over %d", sum.N, sum.Rows, events, instances))
	}
	res.Missing = int64(events) - sum.N
	return res, nil
}

// plainTransition does by hand what a saga transition writes: read the
// row; insert it (version 1) or update it where the version is the one
// read; on a lost race read again, in the same transaction.
func plainTransition(ctx context.Context, tx *gorm.DB, table string, e sagaBenchEvent, attempts *atomic.Int64) error {
	tx = tx.WithContext(ctx)
	for range 100 {
		attempts.Add(1)
		var row sagaBenchInstance
		res := tx.Table(table).Where("correlation_id = ?", e.Instance).Limit(1).Find(&row)
		if res.Error != nil {
			return res.Error
		}
		now := time.Now().UTC()
		if res.RowsAffected == 0 {
			ins := tx.Exec(`INSERT INTO "`+table+`" (correlation_id, current_state, version, created_at, updated_at, n, last) VALUES (?, 'Active', 1, ?, ?, 1, ?) ON CONFLICT DO NOTHING`,
				e.Instance, now, now, e.Seq)
			if ins.Error != nil {
				return ins.Error
			}
			if ins.RowsAffected == 1 {
				return nil
			}
			continue
		}
		up := tx.Exec(`UPDATE "`+table+`" SET current_state = 'Active', version = ?, updated_at = ?, n = ?, last = ? WHERE correlation_id = ? AND version = ?`,
			row.Version+1, now, row.N+1, e.Seq, e.Instance, row.Version)
		if up.Error != nil {
			return up.Error
		}
		if up.RowsAffected == 1 {
			return nil
		}
	}
	return errors.New("plain transition: 100 lost races in a row")
}

// preloadSagaEvents publishes events events round-robin over instances
// instances, so that consecutive events are for different instances.
func preloadSagaEvents(url, typ, queue string, events, instances int) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := declareQueue(conn, typ, queue); err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	var pending []*amqp.DeferredConfirmation
	for i := range events {
		body, _ := json.Marshal(sagaBenchEvent{Instance: fmt.Sprintf("i%07d", i%instances), Seq: i})
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
			MessageId: uuid.NewString(), Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
		})
		if err != nil {
			return err
		}
		pending = append(pending, dc)
		if len(pending) == 1000 || i == events-1 {
			for _, dc := range pending {
				if !dc.Wait() {
					return errors.New("preload publish nacked")
				}
			}
			pending = pending[:0]
		}
	}
	return nil
}

func closeGorm(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}
