package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

type runner struct {
	cfg     *config
	env     *env
	rss     *rssSampler
	ids     *idGen
	pad     string
	results []Result
	sweep   []sweepPoint

	basePeak, e2ePeak float64 // closed-loop peaks measured in this run
	// pgPeak is the PostgreSQL transport's closed-loop peak when e2e's
	// interleaved rounds measured it (pg-transport reports it).
	pgPeak *Result
}

// sweepPoint is one (pipeline, offered rate) measurement for the plot.
type sweepPoint struct {
	pipeline      string
	rate          float64
	achieved      float64
	p50, p95, p99 float64
	n             int
}

func newRunner(cfg *config) *runner {
	e := newEnv(cfg.dsn, cfg.url, cfg.cluster, cfg.keep)
	return &runner{
		cfg: cfg, env: e,
		rss: startRSSSampler(250 * time.Millisecond),
		ids: &idGen{prefix: "m-" + e.suffix + "-"},
		pad: padding(cfg.payload),
	}
}

func (r *runner) defaultPhase() phase {
	return phase{warmup: r.cfg.warmup, duration: r.cfg.duration, rate: r.cfg.rate,
		producers: r.cfg.producers, inflight: r.cfg.inflight, drain: r.cfg.drain}
}

func (r *runner) add(res Result) {
	res.LoadAvg1m = loadAvg()
	r.results = append(r.results, res)
	res.clean()
	logf("   %s: %.0f msg/s (produced %.0f/s, ratio %.2f of %s), p50 %.2f p95 %.2f p99 %.2f ms (n=%d), CPU %.0f µs/msg (PostgreSQL %.0f, RabbitMQ %.0f, all three %.0f), RSS peak %.0f MB, dup %d missing %d %v",
		res.key(), res.MsgsPerS, res.ProducedPerS, res.Ratio, res.RatioOf, res.P50, res.P95, res.P99, res.Samples, res.CPUPerMsgUS, res.PGCPUPerMsgUS, res.RabbitCPUPerMsgUS, res.SystemCPUPerMsgUS, res.PeakRSSMB, res.Duplicates, res.Missing, res.Notes)
}

func (r *runner) find(key string) (Result, bool) {
	for i := len(r.results) - 1; i >= 0; i-- {
		if r.results[i].key() == key {
			return r.results[i], true
		}
	}
	return Result{}, false
}

func (r *runner) run(ctx context.Context, s string) error {
	switch s {
	case "baseline":
		if r.cfg.rounds > 1 && slices.Contains(r.cfg.scenarios, "e2e") && r.cfg.rate == 0 {
			logf("   measured by e2e's interleaved rounds")
			return nil
		}
		return r.baseline(ctx)
	case "e2e":
		return r.e2e(ctx)
	case "watermill-forwarder":
		return r.forwarder(ctx)
	case "fixed-rate":
		return r.fixedRate(ctx)
	case "sweep":
		return r.sweepRates(ctx)
	case "idle-latency":
		return r.idleLatency(ctx)
	case "embedded":
		return r.embedded(ctx)
	case "inbox-overhead":
		return r.inboxOverhead(ctx)
	case "backlog":
		return r.backlogScenario(ctx)
	case "scheduled":
		return r.scheduledScenario(ctx)
	case "e2e-cluster":
		return r.e2eCluster(ctx)
	case "pg-transport":
		return r.pgTransport(ctx)
	case "watermill":
		return r.watermill(ctx)
	case "saga":
		return r.sagaScenario(ctx)
	case "soak":
		return r.soakRun(ctx)
	case "request-response":
		return r.requestResponse(ctx)
	case "ordering":
		return r.orderingScenario(ctx)
	}
	return fmt.Errorf("unknown scenario %q", s)
}

// measure starts p, runs one phase, checks the effects and closes p.
func (r *runner) measure(ctx context.Context, scenario, variant string, p pipeline, tr *tracker, ph phase) (Result, error) {
	if err := p.Start(ctx); err != nil {
		_ = p.Close(ctx)
		return Result{}, fmt.Errorf("%s: start: %w", p.Name(), err)
	}
	pr := runPhase(ctx, p, tr, r.rss, ph, r.ids, r.pad)
	res := toResult(scenario, variant, r.cfg, ph, pr)
	verifyInto(ctx, p, &res, pr.produced)
	if err := p.Close(ctx); err != nil {
		res.Notes = append(res.Notes, "close: "+err.Error())
	}
	return res, nil
}

func variantFor(rate float64) string {
	if rate > 0 {
		return fmt.Sprintf("rate=%.0f", rate)
	}
	return "peak"
}

// ensureBaseline measures the baseline's closed-loop peak once per run.
func (r *runner) ensureBaseline(ctx context.Context) error {
	if r.basePeak > 0 {
		return nil
	}
	return r.baseline(ctx)
}

func (r *runner) baseline(ctx context.Context) error {
	ph := r.defaultPhase()
	tr := newTracker()
	res, err := r.measure(ctx, "baseline", variantFor(ph.rate), newBaseline(r.cfg, r.env, tr, "base"), tr, ph)
	if err != nil {
		return err
	}
	if ph.rate == 0 {
		r.basePeak = res.MsgsPerS
	}
	res.setRatio(res.MsgsPerS, "itself")
	r.add(res)
	return nil
}

func (r *runner) e2e(ctx context.Context) error {
	if r.cfg.rounds > 1 && r.cfg.rate == 0 && r.cfg.cpuprofile == "" {
		return r.e2eRounds(ctx)
	}
	if err := r.ensureBaseline(ctx); err != nil {
		return err
	}
	ph := r.defaultPhase()
	tr := newTracker()
	p := newBareWire(r.cfg, r.env, tr, "e2e")
	if r.cfg.cpuprofile != "" {
		f, err := os.Create(r.cfg.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := p.Start(ctx); err != nil {
			_ = p.Close(ctx)
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		pr := runPhase(ctx, p, tr, r.rss, ph, r.ids, r.pad)
		pprof.StopCPUProfile()
		res := toResult("e2e", variantFor(ph.rate), r.cfg, ph, pr)
		verifyInto(ctx, p, &res, pr.produced)
		if err := p.Close(ctx); err != nil {
			res.Notes = append(res.Notes, "close: "+err.Error())
		}
		res.Notes = append(res.Notes, "CPU profile written to "+r.cfg.cpuprofile)
		r.finishE2E(res, ph)
		return nil
	}
	res, err := r.measure(ctx, "e2e", variantFor(ph.rate), p, tr, ph)
	if err != nil {
		return err
	}
	r.finishE2E(res, ph)
	return nil
}

// e2eRounds alternates baseline and e2e runs (and pg-transport runs, when
// that scenario is selected too) and reports medians: on a machine shared
// with other work, interleaving spreads the noise evenly.
func (r *runner) e2eRounds(ctx context.Context) error {
	var bs, es, ratios []float64
	var lastB, lastE Result
	withPG := slices.Contains(r.cfg.scenarios, "pg-transport")
	var ps, pgRatios, pgE2ERatios []float64
	var lastP Result
	for i := range r.cfg.rounds {
		logf("   round %d of %d", i+1, r.cfg.rounds)
		ph := r.defaultPhase()
		tr := newTracker()
		b, err := r.measure(ctx, "baseline", "peak", newBaseline(r.cfg, r.env, tr, fmt.Sprintf("base%d", i)), tr, ph)
		if err != nil {
			return err
		}
		tr = newTracker()
		e, err := r.measure(ctx, "e2e", "peak", newBareWire(r.cfg, r.env, tr, fmt.Sprintf("e2e%d", i)), tr, ph)
		if err != nil {
			return err
		}
		if withPG {
			tr = newTracker()
			pg, err := r.measure(ctx, "pg-transport", "peak", newPGTransport(r.cfg, r.env, tr, fmt.Sprintf("pgt%d", i)), tr, ph)
			if err != nil {
				return err
			}
			logf("   round %d: pg-transport %.0f msg/s, ratio %.2f to baseline, %.2f to e2e", i+1, pg.MsgsPerS, pg.MsgsPerS/b.MsgsPerS, pg.MsgsPerS/e.MsgsPerS)
			ps, pgRatios, pgE2ERatios = append(ps, pg.MsgsPerS), append(pgRatios, pg.MsgsPerS/b.MsgsPerS), append(pgE2ERatios, pg.MsgsPerS/e.MsgsPerS)
			lastP = pg
		}
		if err := r.env.cleanup(ctx); err != nil {
			logf("   cleanup: %v", err)
		}
		logf("   round %d: baseline %.0f msg/s, e2e %.0f msg/s, ratio %.2f", i+1, b.MsgsPerS, e.MsgsPerS, e.MsgsPerS/b.MsgsPerS)
		bs, es, ratios = append(bs, b.MsgsPerS), append(es, e.MsgsPerS), append(ratios, e.MsgsPerS/b.MsgsPerS)
		lastB, lastE = b, e
	}
	med := func(xs []float64) float64 { return percentiles(xs, 50)[0] }
	lastB.MsgsPerS = med(bs)
	lastB.setRatio(lastB.MsgsPerS, "itself")
	lastB.Extra = map[string]any{"rounds_msgs_per_s": bs}
	lastB.Notes = append(lastB.Notes, fmt.Sprintf("median of %d rounds interleaved with e2e; latency and RSS from the last round", r.cfg.rounds))
	r.basePeak = lastB.MsgsPerS
	r.add(lastB)
	r.medianOfRounds(&lastE, lastB.MsgsPerS, es, ratios, "median of %d rounds; latency and RSS from the last round")
	r.e2ePeak = lastE.MsgsPerS
	r.add(lastE)
	if withPG {
		r.medianOfRounds(&lastP, lastB.MsgsPerS, ps, pgRatios, "median of %d rounds interleaved with baseline and e2e; latency and RSS from the last round")
		lastP.Extra["rounds_ratio_to_e2e"] = pgE2ERatios
		lastP.Extra["ratio_to_e2e"] = med(pgE2ERatios)
		r.pgPeak = &lastP // reported by the pg-transport scenario
	}
	return nil
}

// medianOfRounds turns the last round's result into the rounds' summary:
// the median rate and the median of the per-round ratios to the baseline,
// with the per-round values in Extra and a note (with %d for the number of
// rounds).
func (r *runner) medianOfRounds(res *Result, baseline float64, rates, ratios []float64, note string) {
	res.MsgsPerS = percentiles(rates, 50)[0]
	res.BaselineMsgsPerS = baseline
	res.Ratio = percentiles(ratios, 50)[0]
	res.RatioOf = fmt.Sprintf("baseline; median of %d interleaved per-round ratios", r.cfg.rounds)
	if res.Extra == nil {
		res.Extra = map[string]any{}
	}
	res.Extra["rounds_msgs_per_s"] = rates
	res.Extra["rounds_ratio"] = ratios
	res.Notes = append(res.Notes, fmt.Sprintf(note, r.cfg.rounds))
}

func (r *runner) finishE2E(res Result, ph phase) {
	if ph.rate == 0 {
		r.e2ePeak = res.MsgsPerS
	}
	res.setRatio(r.basePeak, "baseline peak")
	r.add(res)
}

// fwdMode is a configuration of the Watermill forwarder pipeline.
type fwdMode int

const (
	fwdDefaults      fwdMode = iota // the libraries' defaults
	fwdTuned                        // 10 ms poll, pooled channel, prefetch, N handlers (no confirms, as the default)
	fwdTunedConfirms                // tuned, plus publisher confirms (what an outbox needs)
)

func (m fwdMode) String() string {
	return [...]string{"defaults", "tuned", "tuned+confirms"}[m]
}

func (r *runner) forwarder(ctx context.Context) error {
	if err := r.ensureBaseline(ctx); err != nil {
		return err
	}
	if !forwarderBuilt {
		return errNoForwarderBuild
	}
	for _, mode := range []fwdMode{fwdDefaults, fwdTuned, fwdTunedConfirms} {
		ph := r.defaultPhase()
		tr := newTracker()
		variant := mode.String()
		if ph.rate > 0 {
			variant += " " + variantFor(ph.rate)
		}
		res, err := r.measure(ctx, "watermill-forwarder", variant, newForwarder(r.cfg, r.env, tr, fmt.Sprintf("fwd%d", mode), mode), tr, ph)
		if err != nil {
			return err
		}
		res.setRatio(r.basePeak, "baseline peak")
		switch mode {
		case fwdDefaults:
			res.Notes = append(res.Notes, "defaults: SQL subscriber poll 1s, AMQP publish without confirms (the library default) on a new channel per publish, one consumer handler, prefetch 1")
		case fwdTuned:
			res.Notes = append(res.Notes, fmt.Sprintf("tuned: SQL subscriber poll 10ms, pooled AMQP channel, no confirms (as the default), %d consumer handlers with prefetch 2", r.cfg.consumers))
		case fwdTunedConfirms:
			res.Notes = append(res.Notes, "tuned+confirms: as tuned, with publisher confirms (each publish waits for its own confirm)")
		}
		r.add(res)
	}
	return nil
}

// fixedRate runs baseline, e2e and the tuned forwarder at one offered rate
// (-rate, else 400 msg/s) for a like-for-like latency comparison.
func (r *runner) fixedRate(ctx context.Context) error {
	rate := r.cfg.rate
	if rate <= 0 {
		rate = 400
	}
	ph := r.defaultPhase()
	ph.rate = rate
	v := variantFor(rate)
	mk := []struct {
		variant string
		p       func(tr *tracker) pipeline
	}{
		{"baseline " + v, func(tr *tracker) pipeline { return newBaseline(r.cfg, r.env, tr, "frb") }},
		{"e2e " + v, func(tr *tracker) pipeline { return newBareWire(r.cfg, r.env, tr, "fre") }},
		{"watermill-forwarder tuned " + v, func(tr *tracker) pipeline { return newForwarder(r.cfg, r.env, tr, "frf", fwdTuned) }},
	}
	if !forwarderBuilt {
		mk = mk[:2]
	}
	var base float64
	for i, m := range mk {
		tr := newTracker()
		res, err := r.measure(ctx, "fixed-rate", m.variant, m.p(tr), tr, ph)
		if err != nil {
			return err
		}
		if i == 0 {
			base = res.MsgsPerS
		}
		res.setRatio(base, "baseline at the same offered rate")
		r.add(res)
	}
	return nil
}

// sweepRates measures e2e and the baseline at a range of offered rates, for
// the latency-against-rate plot and the half-peak target.
func (r *runner) sweepRates(ctx context.Context) error {
	rates := slices.Clone(r.cfg.rates)
	if len(rates) == 0 {
		if r.cfg.rate == 0 {
			if err := r.ensureBaseline(ctx); err != nil {
				return err
			}
			if r.e2ePeak == 0 {
				if err := r.e2e(ctx); err != nil {
					return err
				}
			}
		}
		if r.e2ePeak == 0 || r.basePeak == 0 {
			return fmt.Errorf("sweep needs -rates, or closed-loop peaks (run without -rate)")
		}
		for _, f := range []float64{0.1, 0.25, 0.5, 0.75, 0.9} {
			rates = append(rates, f*r.e2ePeak)
		}
		for _, f := range []float64{0.5, 0.75, 0.9} {
			rates = append(rates, f*r.basePeak)
		}
		slices.Sort(rates)
		// Drop rates within 8% of the previous one, except half the e2e
		// peak (a target is defined there).
		half := 0.5 * r.e2ePeak
		var kept []float64
		for _, x := range rates {
			x = math.Round(x)
			if len(kept) > 0 && x < kept[len(kept)-1]*1.08 && x != math.Round(half) {
				continue
			}
			kept = append(kept, x)
		}
		rates = kept
	}
	logf("   sweep rates: %v", rates)
	for _, kind := range []string{"e2e", "baseline"} {
		tr := newTracker()
		var p pipeline
		if kind == "e2e" {
			p = newBareWire(r.cfg, r.env, tr, "swe")
		} else {
			p = newBaseline(r.cfg, r.env, tr, "swb")
		}
		if err := p.Start(ctx); err != nil {
			_ = p.Close(ctx)
			return fmt.Errorf("%s: start: %w", kind, err)
		}
		var total int64
		var last *Result
		for _, rate := range rates {
			if ctx.Err() != nil {
				break
			}
			ph := r.defaultPhase()
			ph.rate, ph.duration = rate, r.cfg.sweepDur
			pr := runPhase(ctx, p, tr, r.rss, ph, r.ids, r.pad)
			total += pr.produced
			res := toResult("sweep", fmt.Sprintf("%s rate=%.0f", kind, rate), r.cfg, ph, pr)
			if math.Round(rate) == math.Round(0.5*r.e2ePeak) && kind == "e2e" {
				res.Extra = map[string]any{"half_e2e_peak": true}
			}
			res.setRatio(r.basePeak, "baseline peak")
			r.add(res)
			last = &r.results[len(r.results)-1]
			r.sweep = append(r.sweep, sweepPoint{pipeline: kind, rate: rate, achieved: pr.msgsPerS, p50: pr.p50, p95: pr.p95, p99: pr.p99, n: pr.samples})
			if !pr.drained {
				break // saturated beyond recovery: higher rates would only queue more
			}
		}
		if last != nil {
			verifyInto(ctx, p, last, total)
		}
		if err := p.Close(ctx); err != nil {
			logf("   %s close: %v", kind, err)
		}
	}
	return nil
}

// idleLatency sends one message at a time into an idle system (the relay
// back on its 1 s PollingInterval between messages) and measures commit to
// consumer commit.
func (r *runner) idleLatency(ctx context.Context) error {
	for _, plain := range []bool{false, true} {
		tr := newTracker()
		label, variant := "idle", "bus.Transaction (in-process wake)"
		if plain {
			label, variant = "idln", "plain db.Transaction (NOTIFY wake)"
		}
		p := newBareWire(r.cfg, r.env, tr, label)
		p.plainTx = plain
		p.outboxOpts = func(o *outbox.Options) { o.PollingInterval = time.Second }
		res, err := r.idleRun(ctx, p, tr, "idle-latency", variant)
		if err != nil {
			return err
		}
		res.Notes = append([]string{"PollingInterval 1s; one message at a time after 300–500 ms of silence"}, res.Notes...)
		r.add(res)
	}
	return nil
}

// idleRun starts p, sends one message at a time after 300–500 ms of
// silence for at least 30 s, measures producer commit to consumer commit,
// checks the effects and closes p.
func (r *runner) idleRun(ctx context.Context, p *barewirePipe, tr *tracker, scenario, variant string) (Result, error) {
	if err := p.Start(ctx); err != nil {
		_ = p.Close(ctx)
		return Result{}, err
	}
	ch := make(chan string, 16)
	tr.notify.Store(&ch)
	// At one message per ~0.4 s, take at least 30 s for enough samples.
	start := time.Now().Add(r.cfg.warmup)
	end := start.Add(max(r.cfg.duration, 30*time.Second))
	tr.setWindow(start, end)
	timeouts := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		// 300–500 ms of silence: the relay's re-checks after its last
		// empty pass (2, 10, 40, 150 ms) are over; it waits on its poll.
		time.Sleep(300*time.Millisecond + rand.N(200*time.Millisecond))
		id := r.ids.next()
		if err := p.Produce(ctx, id, benchMsg{ID: id, Amount: 1, TS: time.Now().UnixNano(), Pad: r.pad}); err != nil {
			_ = p.Close(ctx)
			return Result{}, err
		}
		deadline := time.After(5 * time.Second)
	wait:
		for {
			select {
			case got := <-ch:
				if got == id {
					break wait
				}
			case <-deadline:
				timeouts++
				break wait
			case <-ctx.Done():
				break wait
			}
		}
	}
	lat := tr.samples()
	ps := percentiles(lat, 50, 95, 99, 100)
	res := Result{Scenario: scenario, Variant: variant, P50: ps[0], P95: ps[1], P99: ps[2], Max: ps[3], Samples: len(lat),
		Produced: tr.produced.Load(), Consumed: tr.consumed.Load(), DurationS: end.Sub(start).Seconds(), Producers: 1, Consumers: r.cfg.consumers, Payload: r.cfg.payload}
	res.RSSStartMB, res.RSSMidMB, res.RSSEndMB, res.PeakRSSMB = r.rss.window(start, end)
	if st := tr.stageSamples(); len(st) > 0 {
		ps := percentiles(st, 50, 99)
		res.Extra = map[string]any{"commit_to_handler_start_p50_ms": ps[0], "commit_to_handler_start_p99_ms": ps[1]}
	}
	if timeouts > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d messages not consumed within 5s", timeouts))
	}
	verifyInto(ctx, p, &res, res.Produced)
	if err := p.Close(ctx); err != nil {
		res.Notes = append(res.Notes, "close: "+err.Error())
	}
	return res, nil
}

// pgTransport measures the e2e pipeline on the PostgreSQL transport: the
// same producer transaction (business row + PublishTx) and the same
// endpoint with the inbox, but the message is written to the queue table in
// the producer's transaction (no RabbitMQ, no outbox row, no relay). It
// reports the closed-loop peak with its ratio to this run's baseline and
// to this run's RabbitMQ e2e, then the idle latency.
func (r *runner) pgTransport(ctx context.Context) error {
	peak := r.pgPeak
	if peak == nil {
		if err := r.ensureBaseline(ctx); err != nil {
			return err
		}
		ph := r.defaultPhase()
		tr := newTracker()
		res, err := r.measure(ctx, "pg-transport", variantFor(ph.rate), newPGTransport(r.cfg, r.env, tr, "pgt"), tr, ph)
		if err != nil {
			return err
		}
		if ph.rate > 0 {
			res.setRatio(ph.rate, "offered rate")
		} else {
			res.setRatio(r.basePeak, "baseline peak")
		}
		peak = &res
	}
	if r.e2ePeak > 0 && peak.OfferedRate == 0 {
		ratio := peak.MsgsPerS / r.e2ePeak
		if v, ok := peak.Extra["ratio_to_e2e"].(float64); ok {
			ratio = v // median of the interleaved per-round ratios
		}
		if peak.Extra == nil {
			peak.Extra = map[string]any{}
		}
		peak.Extra["e2e_msgs_per_s"] = r.e2ePeak
		peak.Extra["ratio_to_e2e"] = ratio
		peak.Notes = append(peak.Notes, fmt.Sprintf("ratio to this run's RabbitMQ e2e (%.0f msg/s): %.2f", r.e2ePeak, ratio))
	} else if peak.OfferedRate == 0 {
		peak.Notes = append(peak.Notes, "no e2e peak in this run: add e2e to -scenario for the ratio to RabbitMQ")
	}
	peak.Notes = append(peak.Notes, "PostgreSQL transport in the same database: PublishTx writes to the queue table in the producer's transaction")
	r.add(*peak)

	tr := newTracker()
	p := newPGTransport(r.cfg, r.env, tr, "pgti")
	res, err := r.idleRun(ctx, p, tr, "pg-transport", "idle (NOTIFY wake)")
	if err != nil {
		return err
	}
	res.Notes = append([]string{"PollInterval 1s (the default); one message at a time after 300–500 ms of silence"}, res.Notes...)
	r.add(res)
	return nil
}

// e2eCluster measures the e2e pipeline on a RabbitMQ cluster with a
// quorum queue, with its ratio to the baseline and to this run's
// single-broker e2e (run e2e first in the same -scenario list for it).
func (r *runner) e2eCluster(ctx context.Context) error {
	if r.cfg.cluster == "" {
		return fmt.Errorf("e2e-cluster: no cluster; pass -cluster URL1,URL2,URL3 or set BAREWIRE_TEST_AMQP_CLUSTER_URLS (scripts/rabbitmq-cluster.sh urls)")
	}
	if err := r.ensureBaseline(ctx); err != nil {
		return err
	}
	ph := r.defaultPhase()
	tr := newTracker()
	res, err := r.measure(ctx, "e2e-cluster", variantFor(ph.rate), newCluster(r.cfg, r.env, tr, "e2ec"), tr, ph)
	if err != nil {
		return err
	}
	if ph.rate > 0 {
		res.setRatio(ph.rate, "offered rate")
	} else {
		res.setRatio(r.basePeak, "baseline peak")
		if r.e2ePeak > 0 {
			if res.Extra == nil {
				res.Extra = map[string]any{}
			}
			res.Extra["e2e_msgs_per_s"] = r.e2ePeak
			res.Extra["ratio_to_e2e"] = res.MsgsPerS / r.e2ePeak
			res.Notes = append(res.Notes, fmt.Sprintf("ratio to this run's single-broker e2e (%.0f msg/s, classic queue): %.2f", r.e2ePeak, res.MsgsPerS/r.e2ePeak))
		} else {
			res.Notes = append(res.Notes, "no e2e peak in this run: add e2e before e2e-cluster in -scenario for the ratio to the single broker")
		}
	}
	res.Notes = append(res.Notes, fmt.Sprintf("quorum queue on the cluster %s (the bus lists every node and connects to the first)", redactURLs(r.cfg.cluster)))
	r.add(res)
	return nil
}

// redactURLs hides the passwords of comma-separated AMQP URLs.
func redactURLs(list string) string {
	var out []string
	for _, u := range strings.Split(list, ",") {
		if pu, err := url.Parse(strings.TrimSpace(u)); err == nil {
			out = append(out, pu.Redacted())
		}
	}
	return strings.Join(out, ",")
}

// embedded measures the embedded default: closed loop, then at half of
// that peak for latency.
func (r *runner) embedded(ctx context.Context) error {
	tr := newTracker()
	p := newEmbedded(r.cfg, r.env, tr)
	if err := p.Start(ctx); err != nil {
		_ = p.Close(ctx)
		return err
	}
	var total int64
	var peak float64
	for i, rate := range []float64{0, -1} {
		ph := r.defaultPhase()
		ph.rate = 0
		if i == 1 {
			ph.rate = math.Round(peak / 2)
			if ph.rate < 1 {
				break
			}
		}
		_ = rate
		pr := runPhase(ctx, p, tr, r.rss, ph, r.ids, r.pad)
		total += pr.produced
		variant := "peak"
		if ph.rate > 0 {
			variant = fmt.Sprintf("half peak rate=%.0f", ph.rate)
		} else {
			peak = pr.msgsPerS
		}
		res := toResult("embedded", variant, r.cfg, ph, pr)
		res.setRatio(r.basePeak, "baseline peak (PostgreSQL + RabbitMQ)")
		res.Notes = append(res.Notes, "in-memory SQLite + in-process transport; consumer commit timed at handler end")
		if i == 1 {
			verifyInto(ctx, p, &res, total)
		}
		r.add(res)
	}
	return p.Close(ctx)
}

// inboxOverhead preloads a queue and measures how fast an endpoint drains
// it with the inbox off, two-phase (default) and single-transaction.
func (r *runner) inboxOverhead(ctx context.Context) error {
	modes := []struct {
		name string
		mode endpoint.InboxMode
	}{{"InboxOff", endpoint.InboxOff}, {"InboxTwoPhase (default)", endpoint.InboxTwoPhase}, {"InboxSingleTransaction", endpoint.InboxSingleTransaction}}
	// With -rounds > 1 the modes run forward then backward (ABCCBA), so that
	// a drift in the machine's load affects every mode alike; each mode
	// reports the mean of its runs.
	order := []int{0, 1, 2}
	if r.cfg.rounds > 1 {
		order = append(order, 2, 1, 0)
	}
	runs := make([][]Result, len(modes))
	for k, i := range order {
		m := modes[i]
		tr := newTracker()
		p := newBareWire(r.cfg, r.env, tr, fmt.Sprintf("ibx%d", k))
		p.inbox = m.mode
		res, err := r.drainPreloaded(ctx, p, tr, r.cfg.inboxMsgs)
		if err != nil {
			return err
		}
		logf("   %s: %.0f msg/s", m.name, res.MsgsPerS)
		runs[i] = append(runs[i], res)
		if err := r.env.cleanup(ctx); err != nil {
			logf("   cleanup: %v", err)
		}
	}
	var off float64
	for i, m := range modes {
		res := runs[i][len(runs[i])-1]
		var sum float64
		var rates []float64
		for _, x := range runs[i] {
			sum += x.MsgsPerS
			rates = append(rates, x.MsgsPerS)
		}
		res.MsgsPerS = sum / float64(len(runs[i]))
		if len(rates) > 1 {
			res.Extra = map[string]any{"runs_msgs_per_s": rates}
			res.Notes = append(res.Notes, fmt.Sprintf("mean of %d runs in ABCCBA order", len(rates)))
		}
		res.Scenario, res.Variant = "inbox-overhead", m.name
		if i == 0 {
			off = res.MsgsPerS
		}
		res.setRatio(off, "InboxOff")
		r.add(res)
	}
	return nil
}

// drainPreloaded fills the endpoint's queue with n messages before the bus
// starts, then times the endpoint draining it.
func (r *runner) drainPreloaded(ctx context.Context, p *barewirePipe, tr *tracker, n int) (Result, error) {
	if err := p.prepare(ctx); err != nil {
		return Result{}, err
	}
	defer p.Close(ctx)
	if err := preload(r.env.url, p.typ, p.queue, r.ids, r.pad, n); err != nil {
		return Result{}, fmt.Errorf("preload: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return Result{}, err
	}
	limit := time.Now().Add(r.cfg.duration + r.cfg.drain)
	var t0 time.Time
	var c0 int64
	cpu0 := cpuTime()
	for time.Now().Before(limit) && ctx.Err() == nil {
		c := tr.consumed.Load()
		if t0.IsZero() && c > 0 {
			t0, c0, cpu0 = time.Now(), c, cpuTime()
		}
		if c >= int64(n) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	t1, c1, cpu1 := time.Now(), tr.consumed.Load(), cpuTime()
	res := Result{Produced: int64(n), Consumed: c1, Producers: 0, Consumers: r.cfg.consumers, Payload: r.cfg.payload}
	if !t0.IsZero() && t1.After(t0) {
		res.MsgsPerS = float64(c1-c0) / t1.Sub(t0).Seconds()
		res.DurationS = t1.Sub(t0).Seconds()
		if c1 > c0 {
			res.CPUPerMsgUS = float64(cpu1-cpu0) / float64(time.Microsecond) / float64(c1-c0)
		}
		res.RSSStartMB, res.RSSMidMB, res.RSSEndMB, res.PeakRSSMB = r.rss.window(t0, t1)
	}
	if c1 < int64(n) {
		res.Notes = append(res.Notes, fmt.Sprintf("only %d of %d consumed in time", c1, n))
	}
	verifyInto(ctx, p, &res, int64(n))
	return res, nil
}

// soakRun holds a fixed rate for -soak and reports RSS at start, middle
// and end.
func (r *runner) soakRun(ctx context.Context) error {
	rate := r.cfg.rate
	if rate <= 0 {
		rate = 500
		if r.e2ePeak > 0 {
			rate = math.Round(r.e2ePeak / 2)
		}
	}
	ph := r.defaultPhase()
	ph.rate, ph.duration = rate, r.cfg.soak
	tr := newTracker()
	res, err := r.measure(ctx, "soak", fmt.Sprintf("e2e rate=%.0f for %v", rate, r.cfg.soak), newBareWire(r.cfg, r.env, tr, "soak"), tr, ph)
	if err != nil {
		return err
	}
	res.setRatio(rate, "offered rate")
	r.add(res)
	return nil
}

// targets checks the goals against this run's results.
func (r *runner) targets() []target {
	var ts []target
	add := func(name, goal, measured string, v float64, pass bool) {
		ts = append(ts, target{Scenario: "target", Name: name, Goal: goal, Measured: measured, Value: v, Pass: pass})
	}
	e2e, okE := r.find("e2e/peak")
	if okE && e2e.Ratio > 0 {
		v := e2e.Ratio
		add("e2e throughput vs baseline", ">= 0.8x", fmt.Sprintf("%.0f / %.0f msg/s = %.2fx (%s)", e2e.MsgsPerS, e2e.BaselineMsgsPerS, v, e2e.RatioOf), v, v >= 0.8)
	}
	// Issue #16's: at least the tuned forwarder without confirms, and 2.5x
	// the tuned forwarder with them (what an outbox needs to know the
	// broker has a message).
	for _, fwt := range []struct {
		variant string
		goal    float64
	}{{"tuned", 1.0}, {"tuned+confirms", 2.5}} {
		if fw, ok := r.find("watermill-forwarder/" + fwt.variant); okE && ok && fw.MsgsPerS > 0 {
			v := e2e.MsgsPerS / fw.MsgsPerS
			add("e2e throughput vs forwarder "+fwt.variant, fmt.Sprintf(">= %.1fx", fwt.goal), fmt.Sprintf("%.0f / %.0f msg/s = %.2fx", e2e.MsgsPerS, fw.MsgsPerS, v), v, v >= fwt.goal)
		}
	}
	// CPU per message against the baseline's in the same run: the client
	// (this process) and the whole machine (this process, PostgreSQL and
	// RabbitMQ).
	if base, ok := r.find("baseline/peak"); okE && ok && base.CPUPerMsgUS > 0 && e2e.CPUPerMsgUS > 0 {
		v := e2e.CPUPerMsgUS / base.CPUPerMsgUS
		add("e2e client CPU per message vs baseline", "<= 2.0x", fmt.Sprintf("%.0f / %.0f µs = %.2fx", e2e.CPUPerMsgUS, base.CPUPerMsgUS, v), v, v <= 2)
		if base.SystemCPUPerMsgUS > 0 && e2e.SystemCPUPerMsgUS > 0 {
			v := e2e.SystemCPUPerMsgUS / base.SystemCPUPerMsgUS
			add("e2e whole-machine CPU per message vs baseline", "<= 1.5x", fmt.Sprintf("%.0f / %.0f µs = %.2fx", e2e.SystemCPUPerMsgUS, base.SystemCPUPerMsgUS, v), v, v <= 1.5)
		}
	}
	if pgt, ok := r.find("pg-transport/peak"); ok {
		// The median of the per-round ratios when rounds ran, as printed
		// with the result.
		if v, ok := pgt.Extra["ratio_to_e2e"].(float64); ok && v > 0 {
			add("PostgreSQL transport vs RabbitMQ e2e", ">= 0.8x", fmt.Sprintf("%.0f msg/s = %.2fx of e2e", pgt.MsgsPerS, v), v, v >= 0.8)
		}
	}
	for _, res := range r.results {
		if res.Scenario != "fixed-rate" || len(res.Variant) < 4 || res.Variant[:4] != "e2e " {
			continue
		}
		rate := res.Variant[4:]
		if fw, ok := r.find("fixed-rate/watermill-forwarder tuned " + rate); ok && fw.P99 > 0 {
			v := res.P99 / fw.P99
			add("e2e p99 vs tuned forwarder p99 at "+rate, "<= 0.25x", fmt.Sprintf("%.1f / %.1f ms = %.2fx", res.P99, fw.P99, v), v, v <= 0.25)
		}
	}
	for _, res := range r.results {
		if res.Scenario == "idle-latency" && res.Samples > 0 {
			add("idle p50 ("+res.Variant+")", "<= 10 ms", fmt.Sprintf("%.2f ms (n=%d)", res.P50, res.Samples), res.P50, res.P50 <= 10)
			add("idle p99 ("+res.Variant+")", "<= 50 ms", fmt.Sprintf("%.2f ms (n=%d)", res.P99, res.Samples), res.P99, res.P99 <= 50)
		}
		if res.Scenario == "sweep" && res.Extra["half_e2e_peak"] == true {
			add("e2e p99 at half of peak ("+res.Variant+")", "<= 50 ms", fmt.Sprintf("%.1f ms at %.0f msg/s achieved", res.P99, res.MsgsPerS), res.P99, res.P99 <= 50 && res.Samples > 0)
		}
		if res.Scenario == "inbox-overhead" && res.RatioOf == "InboxOff" && res.Variant != "InboxOff" {
			add("inbox throughput vs no inbox ("+res.Variant+")", ">= 0.6x", fmt.Sprintf("%.0f / %.0f msg/s = %.2fx", res.MsgsPerS, res.BaselineMsgsPerS, res.Ratio), res.Ratio, res.Ratio >= 0.6)
		}
		if res.Scenario == "saga" && res.Variant == "spread/saga optimistic" && res.BaselineMsgsPerS > 0 {
			add("saga transitions vs plain consumer, no contention", ">= 0.7x", fmt.Sprintf("%.0f / %.0f events/s = %.2fx", res.MsgsPerS, res.BaselineMsgsPerS, res.Ratio), res.Ratio, res.Ratio >= 0.7)
		}
		if res.Scenario == "soak" && res.RSSMidMB > 0 {
			v := res.RSSEndMB / res.RSSMidMB
			add("memory flat over the soak", "end <= 1.2x middle RSS", fmt.Sprintf("RSS start/mid/end %.0f/%.0f/%.0f MB", res.RSSStartMB, res.RSSMidMB, res.RSSEndMB), v, v <= 1.2)
		}
	}
	return ts
}
