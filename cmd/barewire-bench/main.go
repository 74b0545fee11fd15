// Command barewire-bench is BareWire's load tool. It drives the full
// pipeline — producer transaction with PublishTx, outbox relay, RabbitMQ,
// an endpoint with the inbox — on real PostgreSQL and RabbitMQ, and measures
// it against a hand-written pgx + amqp091 pipeline (the baseline) and
// Watermill's own outbox (components/forwarder) in the same run. Every
// throughput is reported with its ratio to the baseline, because absolute
// numbers on a shared machine mean little.
//
// Usage:
//
//	barewire-bench -scenario all -duration 15s -plot latency.png
//	barewire-bench -scenario e2e -rate 400 -json
//
// Scenarios: baseline, e2e, pg-transport (the e2e pipeline on the
// PostgreSQL transport: no broker, no relay hop), watermill (the e2e
// pipeline on each Watermill preset: wmamqp on -amqp, wmnats on
// BAREWIRE_TEST_NATS_URL, wmredis on BAREWIRE_TEST_REDIS_ADDR), watermill-forwarder,
// idle-latency, embedded, inbox-overhead, backlog, sweep, soak, saga
// (saga transitions per second beside a plain consumer doing the same
// writes, without and with contention), e2e-cluster (the e2e pipeline on
// the RabbitMQ cluster of -cluster with a quorum queue, beside this run's
// single-broker e2e), ordering (the e2e pipeline with per-key ordering
// off, then on: -ordering-partitions, -ordering-keys), all (a
// comma-separated list works too). Services come from -postgres and -amqp, defaulting to
// BAREWIRE_TEST_POSTGRES_DSN and BAREWIRE_TEST_AMQP_URL, then to local
// defaults; -cluster from BAREWIRE_TEST_AMQP_CLUSTER_URLS. Every table, queue and exchange a run creates has a unique name
// and is removed at the end (unless -keep).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/barewire-go/barewire/endpoint"
)

type config struct {
	scenarios                        []string
	duration                         time.Duration
	warmup                           time.Duration
	producers                        int
	consumers                        int
	prefetch                         int
	payload                          int
	rate                             float64
	inflight                         int
	backlog                          int
	inboxMsgs                        int
	future                           int
	scheduled                        int
	rates                            []float64
	sweepDur                         time.Duration
	soak                             time.Duration
	json                             bool
	jsonFile                         string
	plot                             string
	cpuprofile                       string
	dsn, url                         string
	cluster                          string
	keep                             bool
	drain                            time.Duration
	rounds                           int
	inbox                            endpoint.InboxMode
	relayWorkers                     int
	batch                            int
	orderingPartitions, orderingKeys int
	sagaEvents                       int
	sagaHot                          int
}

var allScenarios = []string{"baseline", "e2e", "pg-transport", "watermill", "watermill-forwarder", "fixed-rate", "sweep", "idle-latency", "embedded", "inbox-overhead", "backlog", "scheduled"}

var knownScenarios = append(slices.Clone(allScenarios), "soak", "saga", "request-response", "e2e-cluster", "ordering", "all")

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parseFlags() (*config, error) {
	c := &config{}
	var scenario, rates, inboxMode string
	flag.StringVar(&scenario, "scenario", "all", "scenario(s), comma-separated: "+strings.Join(knownScenarios, ", "))
	flag.DurationVar(&c.duration, "duration", 15*time.Second, "measured time per scenario phase (after -warmup)")
	flag.DurationVar(&c.warmup, "warmup", 2*time.Second, "load before each measured window")
	flag.IntVar(&c.producers, "producers", 16, "producer goroutines (one transaction each at a time)")
	flag.IntVar(&c.consumers, "consumers", 8, "concurrent consumers per endpoint")
	flag.IntVar(&c.prefetch, "prefetch", 2, "BareWire pipelines: PrefetchCount per consumer (the bus's default is 1; 2 is what earlier measurements used)")
	flag.IntVar(&c.payload, "payload", 256, "message body size in bytes")
	flag.Float64Var(&c.rate, "rate", 0, "fixed offered rate in msg/s for baseline, e2e, watermill-forwarder and soak (0: closed loop at peak)")
	flag.IntVar(&c.inflight, "inflight", 2000, "closed loop: producers pause while this many messages are committed but not yet consumed")
	flag.IntVar(&c.backlog, "backlog", 1_000_000, "backlog scenario: undelivered outbox rows to drain (as many delivered rows are retained beside them)")
	flag.IntVar(&c.future, "future-rows", 100_000, "scheduled: outbox rows scheduled an hour or more ahead, waiting beside the measured ones")
	flag.IntVar(&c.scheduled, "scheduled-msgs", 1000, "scheduled: messages scheduled 0.5–10.5 s ahead whose due → consumed lateness is measured")
	flag.IntVar(&c.inboxMsgs, "inbox-msgs", 10000, "inbox-overhead: messages preloaded in the queue per mode")
	flag.StringVar(&rates, "rates", "", "sweep: offered rates in msg/s, comma-separated (default: fractions of this run's e2e and baseline peaks)")
	flag.DurationVar(&c.sweepDur, "sweep-duration", 0, "sweep: measured time per rate (default: half of -duration, at least 5s)")
	flag.DurationVar(&c.soak, "soak", 5*time.Minute, "soak: length of the long fixed-rate run that checks memory stays flat")
	flag.BoolVar(&c.json, "json", false, "print one JSON object per result line instead of the table")
	flag.StringVar(&c.jsonFile, "json-file", "", "also write the JSON lines to this file (with the table on stdout)")
	flag.StringVar(&c.plot, "plot", "", "write a PNG of latency percentiles against offered rate (from the sweep) to this file")
	flag.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the e2e scenario's closed-loop run to this file")
	flag.StringVar(&c.dsn, "postgres", envOr("BAREWIRE_TEST_POSTGRES_DSN", "host=127.0.0.1 user=postgres dbname=test sslmode=disable"), "PostgreSQL DSN")
	flag.StringVar(&c.url, "amqp", envOr("BAREWIRE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&c.cluster, "cluster", os.Getenv("BAREWIRE_TEST_AMQP_CLUSTER_URLS"), "e2e-cluster: the RabbitMQ cluster's node URLs, comma-separated (scripts/rabbitmq-cluster.sh urls)")
	flag.BoolVar(&c.keep, "keep", false, "keep the tables, queues and exchanges the run created")
	flag.IntVar(&c.rounds, "rounds", 1, "e2e: alternate baseline and e2e runs (and pg-transport runs, when selected) this many times and report medians (steadier ratios on a noisy machine)")
	flag.StringVar(&inboxMode, "inbox", "two-phase", "inbox mode of the BareWire endpoint in e2e, fixed-rate, sweep, idle-latency and soak: two-phase (the default), single or off")
	flag.IntVar(&c.relayWorkers, "relay-workers", 0, "outbox.Options.RelayWorkers for the BareWire pipelines (0: the default)")
	flag.IntVar(&c.batch, "batch", 0, "endpoint.Batch.MaxMessages of the BareWire endpoints (0: the default; 1: no group commit)")
	flag.IntVar(&c.sagaEvents, "saga-events", 10000, "saga: events per run without contention (half as many under contention)")
	flag.IntVar(&c.orderingPartitions, "ordering-partitions", 8, "ordering: partitions of the ordered endpoint")
	flag.IntVar(&c.orderingKeys, "ordering-keys", 100, "ordering: distinct ordering keys the producers spread messages over")
	flag.IntVar(&c.sagaHot, "saga-hot", 4, "saga: instances that take all the events under contention")
	flag.DurationVar(&c.drain, "drain", 60*time.Second, "after each phase, wait this long at most for the pipeline to drain")
	flag.Parse()

	for _, s := range strings.Split(scenario, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.Contains(knownScenarios, s) {
			return nil, fmt.Errorf("unknown scenario %q; known: %s", s, strings.Join(knownScenarios, ", "))
		}
		if s == "all" {
			c.scenarios = append(c.scenarios, allScenarios...)
			continue
		}
		c.scenarios = append(c.scenarios, s)
	}
	for _, s := range strings.Split(rates, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-rates: bad rate %q", s)
		}
		c.rates = append(c.rates, v)
	}
	switch inboxMode {
	case "two-phase":
		c.inbox = endpoint.InboxTwoPhase
	case "single":
		c.inbox = endpoint.InboxSingleTransaction
	case "off":
		c.inbox = endpoint.InboxOff
	default:
		return nil, fmt.Errorf("-inbox: want two-phase, single or off, not %q", inboxMode)
	}
	if c.sweepDur == 0 {
		c.sweepDur = max(c.duration/2, 5*time.Second)
	}
	switch {
	case c.duration <= 0:
		return nil, fmt.Errorf("-duration must be positive")
	case c.producers < 1 || c.consumers < 1:
		return nil, fmt.Errorf("-producers and -consumers must be at least 1")
	case c.prefetch < 1:
		return nil, fmt.Errorf("-prefetch must be at least 1 (messages per consumer)")
	case c.payload < 0:
		return nil, fmt.Errorf("-payload must not be negative")
	case c.backlog < 1:
		return nil, fmt.Errorf("-backlog must be at least 1")
	case c.sagaEvents < 4 || c.sagaHot < 1:
		return nil, fmt.Errorf("-saga-events must be at least 4 and -saga-hot at least 1")
	}
	return c, nil
}

func main() {
	cfg, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "barewire-bench:", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	r := newRunner(cfg)
	defer r.rss.close()
	logf("barewire-bench: %d CPUs, GOMAXPROCS %d, scenarios %s, run id %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), strings.Join(cfg.scenarios, ","), r.env.suffix)
	failed := false
	for _, s := range cfg.scenarios {
		if ctx.Err() != nil {
			break
		}
		logf("== %s", s)
		if err := r.run(ctx, s); err != nil {
			failed = true
			logf("scenario %s failed: %v", s, err)
			r.results = append(r.results, Result{Scenario: s, Notes: []string{"FAILED: " + err.Error()}})
		}
		if err := r.env.cleanup(context.WithoutCancel(ctx)); err != nil {
			logf("cleanup after %s: %v", s, err)
		}
	}
	targets := r.targets()
	if cfg.jsonFile != "" {
		f, err := os.Create(cfg.jsonFile)
		if err != nil {
			logf("json-file: %v", err)
			failed = true
		} else {
			for _, res := range r.results {
				res.clean()
				writeJSON(f, res)
			}
			for _, t := range targets {
				writeJSON(f, t)
			}
			_ = f.Close()
		}
	}
	if cfg.json {
		for _, res := range r.results {
			res.clean()
			writeJSON(os.Stdout, res)
		}
		for _, t := range targets {
			writeJSON(os.Stdout, t)
		}
	} else {
		fmt.Println()
		writeTable(os.Stdout, r.results)
		writeTargets(os.Stdout, targets)
		for _, res := range r.results {
			for _, k := range []string{"explain_before", "explain_after"} {
				if v, ok := res.Extra[k].(string); ok {
					fmt.Printf("\n[%s] %s:\n%s\n", res.key(), k, v)
				}
			}
		}
	}
	if cfg.plot != "" && len(r.sweep) > 0 {
		if err := writePlot(cfg.plot, r.sweep); err != nil {
			logf("plot: %v", err)
			failed = true
		} else {
			logf("plot written to %s", cfg.plot)
		}
	}
	if failed {
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
