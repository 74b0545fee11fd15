package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
)

// preload declares the endpoint's exchange and queue as the bus would and
// publishes n messages straight into the queue, confirms pipelined.
func preload(url, typ, queue string, ids *idGen, pad string, n int) error {
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
	const window = 1000
	var pending []*amqp.DeferredConfirmation
	wait := func() error {
		for _, dc := range pending {
			if !dc.Wait() {
				return errors.New("preload publish nacked")
			}
		}
		pending = pending[:0]
		return nil
	}
	for range n {
		id := ids.next()
		body, _ := json.Marshal(benchMsg{ID: id, Amount: 1, TS: time.Now().UnixNano(), Pad: pad})
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
			MessageId: id, Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
		})
		if err != nil {
			return err
		}
		pending = append(pending, dc)
		if len(pending) == window {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
}

// drainer consumes a queue with automatic acks and counts, standing in for
// consumers when only the relay is measured.
type drainer struct {
	conn  *amqp.Connection
	count atomic.Int64
	done  chan struct{}
}

func startDrainer(url, exchange, queue string) (*drainer, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	if err := declareQueue(conn, exchange, queue); err != nil {
		conn.Close()
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, err
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		conn.Close()
		return nil, err
	}
	ds, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	d := &drainer{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		for range ds {
			d.count.Add(1)
		}
	}()
	return d, nil
}

func (d *drainer) close() {
	_ = d.conn.Close()
	<-d.done
}

// fillOutboxSQL fills an outbox table with n rows of one status in one
// statement. cols are the table's column list for (message_id,
// destination, payload, status, delivered_at) plus extra constant columns.
func fillRows(ctx context.Context, pool *pgxpool.Pool, insert string, n, payload int, idPrefix, status string) error {
	pad := max(payload-60, 0)
	// Rows go in in chunks so that one statement does not hold everything.
	const chunk = 200_000
	for from := 1; from <= n; from += chunk {
		to := min(from+chunk-1, n)
		if _, err := pool.Exec(ctx, insert, idPrefix, pad, status, from, to); err != nil {
			return err
		}
	}
	return nil
}

// explainIn runs EXPLAIN (ANALYZE, BUFFERS) on stmt inside a transaction
// that is rolled back (the claim is an UPDATE).
func explainIn(ctx context.Context, pool *pgxpool.Pool, stmt string) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+stmt)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			return "", err
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n"), rows.Err()
}

// captureClaim returns the exact claim statement the BareWire relay sends,
// read from pg_stat_activity while a claimed batch is held (the relay's
// statements bypass GORM), with its two parameters (the hold in
// milliseconds, the batch size) inlined. The batch is then settled with
// nothing recorded: its rows stay as they were.
func captureClaim(ctx context.Context, p *barewirePipe) (string, error) {
	st, err := gormstore.New(p.db, gormstore.WithTablePrefix(p.prefix))
	if err != nil {
		return "", err
	}
	const limit, hold = 100, 30 * time.Second
	b, err := st.Outbox().ClaimBatch(ctx, "explain-probe", limit, hold)
	if err != nil {
		return "", err
	}
	var q string
	err = p.db.WithContext(ctx).Raw(`SELECT query FROM pg_stat_activity
WHERE state = 'idle in transaction' AND query LIKE '%SKIP LOCKED%' AND query LIKE ? LIMIT 1`,
		"%"+p.prefix+"outbox%").Scan(&q).Error
	if serr := b.Settle(ctx, outbox.Settlement{}); err == nil {
		err = serr
	}
	if err != nil {
		return "", err
	}
	if q == "" {
		return "", errors.New("claim statement not captured (no held batch in pg_stat_activity)")
	}
	q = strings.Replace(q, "$1", fmt.Sprintf("'%d'", hold.Milliseconds()), 1)
	return strings.Replace(q, "$2", fmt.Sprint(limit), 1), nil
}

// backlogScenario fills the BareWire outbox and the baseline's with N
// undelivered rows behind N delivered ones, EXPLAINs each claim query and
// times each relay draining its backlog into RabbitMQ.
func (r *runner) backlogScenario(ctx context.Context) error {
	n := r.cfg.backlog
	pool, err := pgxpool.New(ctx, r.env.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Baseline first: its rate is the yardstick.
	tr := newTracker()
	bp := newBaseline(r.cfg, r.env, tr, "bkb")
	bp.noConsumers = true
	if err := bp.prepare(ctx); err != nil {
		_ = bp.Close(ctx)
		return err
	}
	bInsert := `INSERT INTO ` + bp.outbox + ` (message_id, destination, payload, status, delivered_at)
SELECT $1::text || g, '` + bp.exchange + `', convert_to('{"id":"' || $1::text || g || '","amount":1,"ts":0,"pad":"' || repeat('x', $2::int) || '"}', 'UTF8'),
  $3::text, CASE WHEN $3::text = 'delivered' THEN now() END
FROM generate_series($4::int, $5::int) g`
	baseRes, err := r.drainBacklog(ctx, pool, n, bInsert, bp.outbox, strings.ReplaceAll(bp.claimSQL, "$1", "100"), "baseline",
		func() (*drainer, error) { return startDrainer(r.env.url, bp.exchange, bp.queue) },
		func() error { return bp.start(ctx) }, func() error { return bp.Close(ctx) })
	if err != nil {
		return err
	}
	baseRes.setRatio(baseRes.MsgsPerS, "itself")
	r.add(baseRes)
	if err := r.env.cleanup(ctx); err != nil {
		logf("   cleanup: %v", err)
	}

	tr = newTracker()
	p := newBareWire(r.cfg, r.env, tr, "bkw")
	p.noConsumer = true
	if err := p.prepare(ctx); err != nil {
		_ = p.Close(ctx)
		return err
	}
	st, err := gormstore.New(p.db, gormstore.WithTablePrefix(p.prefix))
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	wInsert := `INSERT INTO ` + p.prefix + `outbox (message_id, destination, message_type, content_type, payload, status, delivered_at)
SELECT $1::text || g, 'exchange:` + p.typ + `', '` + p.typ + `', 'application/json',
  convert_to('{"id":"' || $1::text || g || '","amount":1,"ts":0,"pad":"' || repeat('x', $2::int) || '"}', 'UTF8'),
  $3::text, CASE WHEN $3::text = 'delivered' THEN now() END
FROM generate_series($4::int, $5::int) g`
	claim := ""
	res, err := r.drainBacklog(ctx, pool, n, wInsert, p.prefix+"outbox", "", "barewire",
		func() (*drainer, error) {
			var err error
			claim, err = captureClaim(ctx, p)
			if err != nil {
				return nil, err
			}
			return startDrainer(r.env.url, p.typ, p.queue)
		},
		func() error { return p.Start(ctx) },
		func() error { return p.Close(ctx) },
		func() string { return claim })
	if err != nil {
		return err
	}
	res.setRatio(baseRes.MsgsPerS, "baseline relay draining the same backlog")
	r.add(res)
	return nil
}

// drainBacklog fills table, EXPLAINs the claim, starts the relay and times
// the drain. claimSQL may be given late by claimFn (after setup ran).
func (r *runner) drainBacklog(ctx context.Context, pool *pgxpool.Pool, n int, insert, table, claimSQL, name string,
	setup func() (*drainer, error), start func() error, stop func() error, claimFn ...func() string) (Result, error) {
	res := Result{Scenario: "backlog", Variant: name, Extra: map[string]any{}, Producers: 0, Consumers: 0, Payload: r.cfg.payload}
	t0 := time.Now()
	if err := fillRows(ctx, pool, insert, n, r.cfg.payload, "bkd-", "delivered"); err != nil {
		_ = stop()
		return res, fmt.Errorf("fill delivered: %w", err)
	}
	if err := fillRows(ctx, pool, insert, n, r.cfg.payload, "bkp-", "pending"); err != nil {
		_ = stop()
		return res, fmt.Errorf("fill pending: %w", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
		_ = stop()
		return res, err
	}
	res.Extra["fill_s"] = time.Since(t0).Seconds()
	res.Extra["pending_rows"] = n
	res.Extra["delivered_rows_retained"] = n
	logf("   %s: filled %d pending + %d delivered rows in %.1fs", name, n, n, time.Since(t0).Seconds())

	d, err := setup()
	if err != nil {
		_ = stop()
		return res, err
	}
	defer d.close()
	if claimSQL == "" && len(claimFn) > 0 {
		claimSQL = claimFn[0]()
	}
	explain := func(key string) {
		plan, err := explainIn(ctx, pool, claimSQL)
		if err != nil {
			res.Notes = append(res.Notes, key+": "+err.Error())
			return
		}
		res.Extra[key] = plan
		res.Extra[key+"_uses_partial_index"] = strings.Contains(plan, table+"_due_idx")
		res.Extra[key+"_exec_ms"] = execTime(plan)
	}
	res.Extra["claim_sql"] = claimSQL
	explain("explain_before")

	if err := start(); err != nil {
		_ = stop()
		return res, err
	}
	begin := time.Now()
	limit := begin.Add(max(r.cfg.drain, 10*time.Minute))
	marks := []float64{0.25, 0.5, 0.75, 1}
	var at []time.Time
	cpu0 := cpuTime()
	for time.Now().Before(limit) && ctx.Err() == nil && len(at) < len(marks) {
		c := d.count.Load()
		for len(at) < len(marks) && float64(c) >= marks[len(at)]*float64(n) {
			at = append(at, time.Now())
		}
		time.Sleep(20 * time.Millisecond)
	}
	end := time.Now()
	got := d.count.Load()
	cpu1 := cpuTime()
	if err := stop(); err != nil {
		res.Notes = append(res.Notes, "stop: "+err.Error())
	}
	var pending int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE status = 'pending'").Scan(&pending); err == nil {
		res.Extra["pending_after"] = pending
	}
	explain("explain_after")
	res.Consumed = got
	res.Produced = int64(n)
	res.Missing = max(int64(n)-got, 0)
	res.DurationS = end.Sub(begin).Seconds()
	res.MsgsPerS = float64(got) / end.Sub(begin).Seconds()
	if got > 0 {
		res.CPUPerMsgUS = float64(cpu1-cpu0) / float64(time.Microsecond) / float64(got)
	}
	res.RSSStartMB, res.RSSMidMB, res.RSSEndMB, res.PeakRSSMB = r.rss.window(begin, end)
	var quarters []float64
	prev, prevT := 0.0, begin
	for i, t := range at {
		q := (marks[i] - prev) * float64(n) / t.Sub(prevT).Seconds()
		quarters = append(quarters, float64(int(q)))
		prev, prevT = marks[i], t
	}
	res.Extra["rate_per_quarter"] = quarters
	if len(at) < len(marks) {
		res.Notes = append(res.Notes, fmt.Sprintf("drained %d of %d within the time limit", got, n))
	}
	return res, nil
}

// execTime pulls "Execution Time: X ms" out of an EXPLAIN ANALYZE plan.
func execTime(plan string) float64 {
	for _, l := range strings.Split(plan, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "Execution Time:") {
			var v float64
			fmt.Sscanf(strings.TrimSpace(l), "Execution Time: %f ms", &v)
			return v
		}
	}
	return 0
}
