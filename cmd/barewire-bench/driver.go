package main

import (
	"context"

	"errors"
	"fmt"
	amqp "github.com/rabbitmq/amqp091-go"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// pipeline is one implementation of "commit a business row and a message
// in one transaction → relay → broker → consumer commits a business row".
type pipeline interface {
	Name() string
	// Start creates tables, queues and connections and starts the relay and
	// the consumers.
	Start(ctx context.Context) error
	// Produce commits one producer transaction carrying message id and
	// reports the commit to the tracker.
	Produce(ctx context.Context, id string, m benchMsg) error
	// Verify counts the consumer-side business rows: all of them and
	// distinct message ids.
	Verify(ctx context.Context) (effects, distinct int64, err error)
	// Close stops everything and removes what Start created.
	Close(ctx context.Context) error
}

// diagnoser is implemented by pipelines that can say where messages wait:
// rows still pending in the outbox, messages ready in the broker queue.
type diagnoser interface {
	Diag(ctx context.Context) map[string]any
}

// waiting samples where messages wait, for pipelines that can tell.
func waiting(ctx context.Context, p pipeline, outboxTable string, url, queue string, q func(ctx context.Context, sql string) (int64, error)) map[string]any {
	d := map[string]any{}
	if n, err := q(ctx, "SELECT count(*) FROM "+outboxTable+" WHERE status = 'pending'"); err == nil {
		d["outbox_pending_at_window_end"] = n
	}
	if conn, err := amqp.Dial(url); err == nil {
		if n, err := queueDepth(conn, queue); err == nil {
			d["queue_ready_at_window_end"] = n
		}
		_ = conn.Close()
	}
	return d
}

// idGen makes message ids unique to the run.
type idGen struct {
	prefix string
	n      atomic.Int64
}

func (g *idGen) next() string { return g.prefix + strconv.FormatInt(g.n.Add(1), 10) }

// phase is one measured load on a started pipeline.
type phase struct {
	warmup, duration time.Duration
	// rate is the offered rate in messages per second; 0 runs closed loop:
	// producers commit as fast as they can while fewer than inflight
	// messages are between producer commit and consumer commit.
	rate      float64
	producers int
	inflight  int
	drain     time.Duration
}

type phaseResult struct {
	msgsPerS                          float64 // consumer commits per second inside the window
	producedPerS                      float64 // producer commits per second inside the window
	p50, p95, p99, pmax               float64
	samples                           int
	rssStart, rssMid, rssEnd, rssPeak float64
	cpuPerMsg                         time.Duration
	pgCPUPerMsg, rabbitCPUPerMsg      time.Duration // the servers' processes (measure.go's serverCPU)
	produced                          int64
	consumed                          int64
	drained                           bool
	produceErrs                       int64
	firstErr                          string
	window                            time.Duration
	// stage50, stage99: producer commit → consumer handler start (ms), when
	// the pipeline reports it.
	stage50, stage99 float64
	stageN           int
	diag             map[string]any
}

// runPhase drives load through p for warmup+duration, waits for the
// pipeline to drain, and measures.
func runPhase(ctx context.Context, p pipeline, tr *tracker, rs *rssSampler, ph phase, ids *idGen, pad string) phaseResult {
	tr.reset()
	start := time.Now().Add(ph.warmup)
	end := start.Add(ph.duration)
	tr.setWindow(start, end)

	// Producers stop between transactions, never in the middle of one: a
	// transaction cut by a cancelled context might commit without being
	// counted.
	stopCh := make(chan struct{})
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopCh) }) }
	defer stop()
	stopped := func() bool {
		select {
		case <-stopCh:
			return true
		default:
			return ctx.Err() != nil
		}
	}
	var wg sync.WaitGroup
	var errCount atomic.Int64
	var firstErr atomic.Pointer[string]
	produce := func() {
		id := ids.next()
		m := benchMsg{ID: id, Amount: 1, TS: time.Now().UnixNano(), Pad: pad}
		if err := p.Produce(ctx, id, m); err != nil && ctx.Err() == nil {
			errCount.Add(1)
			s := err.Error()
			firstErr.CompareAndSwap(nil, &s)
			time.Sleep(10 * time.Millisecond)
		}
	}
	if ph.rate <= 0 {
		for range ph.producers {
			wg.Go(func() {
				for !stopped() {
					if ph.inflight > 0 && tr.produced.Load()-tr.consumed.Load() >= int64(ph.inflight) {
						time.Sleep(200 * time.Microsecond)
						continue
					}
					produce()
				}
			})
		}
	} else {
		jobs := make(chan struct{}, ph.producers*4)
		for range ph.producers {
			wg.Go(func() {
				for range jobs {
					if stopped() {
						continue
					}
					produce()
				}
			})
		}
		wg.Go(func() {
			defer close(jobs)
			t0 := time.Now()
			issued := 0
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				due := int(ph.rate * time.Since(t0).Seconds())
				for issued < due {
					select {
					case jobs <- struct{}{}:
						issued++
					case <-stopCh:
						return
					}
				}
				select {
				case <-stopCh:
					return
				case <-tick.C:
				}
			}
		})
	}

	sleepUntil(ctx, start)
	cpu0, srv0 := cpuTime(), readServerCPU()
	sleepUntil(ctx, end)
	cpu1, srv1 := cpuTime(), readServerCPU()
	var diag map[string]any
	if d, ok := p.(diagnoser); ok {
		diag = d.Diag(ctx)
	}
	inWin := tr.inWindow.Load()
	prodWin := tr.producedInWindow.Load()
	stop()
	wg.Wait()

	// Drain: every committed message must be consumed.
	drainBy := time.Now().Add(ph.drain)
	drained := false
	for time.Now().Before(drainBy) && ctx.Err() == nil {
		if tr.consumed.Load() >= tr.produced.Load() {
			// Duplicates count as consumed too: drained means every
			// committed message has its business row.
			if _, distinct, err := p.Verify(ctx); err != nil || distinct >= tr.total.Load() {
				drained = true
				break
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := phaseResult{
		msgsPerS:     float64(inWin) / ph.duration.Seconds(),
		producedPerS: float64(prodWin) / ph.duration.Seconds(),
		produced:     tr.produced.Load(),
		consumed:     tr.consumed.Load(),
		drained:      drained,
		produceErrs:  errCount.Load(),
		window:       ph.duration,
		diag:         diag,
	}
	if s := firstErr.Load(); s != nil {
		r.firstErr = *s
	}
	if inWin > 0 {
		r.cpuPerMsg = (cpu1 - cpu0) / time.Duration(inWin)
		pg, rabbit := srv1.since(srv0)
		r.pgCPUPerMsg = pg / time.Duration(inWin)
		r.rabbitCPUPerMsg = rabbit / time.Duration(inWin)
	}
	lat := tr.samples()
	r.samples = len(lat)
	ps := percentiles(lat, 50, 95, 99, 100)
	r.p50, r.p95, r.p99, r.pmax = ps[0], ps[1], ps[2], ps[3]
	r.rssStart, r.rssMid, r.rssEnd, r.rssPeak = rs.window(start, end)
	if st := tr.stageSamples(); len(st) > 0 {
		ps := percentiles(st, 50, 99)
		r.stage50, r.stage99, r.stageN = ps[0], ps[1], len(st)
	}
	return r
}

func sleepUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}

// toResult fills a Result from a phase.
func toResult(scenario, variant string, cfg *config, ph phase, r phaseResult) Result {
	res := Result{
		Scenario: scenario, Variant: variant,
		MsgsPerS: r.msgsPerS, ProducedPerS: r.producedPerS, OfferedRate: ph.rate,
		P50: r.p50, P95: r.p95, P99: r.p99, Max: r.pmax, Samples: r.samples,
		PeakRSSMB: r.rssPeak, RSSStartMB: r.rssStart, RSSMidMB: r.rssMid, RSSEndMB: r.rssEnd,
		CPUPerMsgUS:       float64(r.cpuPerMsg) / float64(time.Microsecond),
		PGCPUPerMsgUS:     float64(r.pgCPUPerMsg) / float64(time.Microsecond),
		RabbitCPUPerMsgUS: float64(r.rabbitCPUPerMsg) / float64(time.Microsecond),
		SystemCPUPerMsgUS: float64(r.cpuPerMsg+r.pgCPUPerMsg+r.rabbitCPUPerMsg) / float64(time.Microsecond),
		Produced:          r.produced, Consumed: r.consumed,
		DurationS: ph.duration.Seconds(), Producers: ph.producers, Consumers: cfg.consumers, Payload: cfg.payload,
	}
	if r.stageN > 0 || len(r.diag) > 0 {
		res.Extra = map[string]any{}
		for k, v := range r.diag {
			res.Extra[k] = v
		}
	}
	if r.stageN > 0 {
		res.Extra["commit_to_handler_start_p50_ms"] = r.stage50
		res.Extra["commit_to_handler_start_p99_ms"] = r.stage99
	}
	if !r.drained {
		res.Notes = append(res.Notes, fmt.Sprintf("did not drain within %v: %d produced, %d consumed", ph.drain, r.produced, r.consumed))
	}
	if r.produceErrs > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d producer errors, first: %s", r.produceErrs, r.firstErr))
	}
	return res
}

// verifyInto checks the exactly-once effect: one business row per
// committed message.
func verifyInto(ctx context.Context, p pipeline, res *Result, produced int64) {
	effects, distinct, err := p.Verify(ctx)
	if err != nil {
		res.Notes = append(res.Notes, "verify: "+err.Error())
		return
	}
	res.Duplicates = effects - distinct
	res.Missing = produced - distinct
	if res.Duplicates != 0 || res.Missing != 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("EFFECT CHECK FAILED: %d effects, %d distinct, %d produced", effects, distinct, produced))
	}
}

func joinErrs(errs ...error) error { return errors.Join(errs...) }

// padding returns a filler making the JSON body about n bytes.
func padding(n int) string {
	const overhead = 60 // {"id":"…","amount":1,"ts":…,"pad":""}
	return strings.Repeat("x", max(n-overhead, 0))
}
