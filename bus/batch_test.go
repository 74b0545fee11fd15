package bus_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// batchBackend runs a group-commit test on one database and transport.
type batchBackend struct {
	name string
	// options builds a bus with the endpoints declare declares.
	options func(declare func(*endpoint.Endpoints), more ...func(*outbox.Options)) []bus.Option
	// db returns the database of a started bus, for the effect table.
	db     func(b *bus.Bus) *gorm.DB
	q, typ string
	table  string
}

// batchBackends runs fn on the embedded default (SQLite, in-process) and on
// PostgreSQL with RabbitMQ.
func batchBackends(t *testing.T, fn func(t *testing.T, be *batchBackend)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "bw.db")
		fn(t, &batchBackend{
			name: "sqlite", q: "gc", typ: "GC", table: "effects",
			options: func(declare func(*endpoint.Endpoints), more ...func(*outbox.Options)) []bus.Option {
				opts := []bus.Option{quiet(), bus.WithSQLite(path), inprocEndpoints(declare)}
				for _, m := range more {
					opts = append(opts, bus.WithOutbox(m))
				}
				return opts
			},
			db: func(b *bus.Bus) *gorm.DB { return b.DB() },
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		env := newRealEnv(t)
		fn(t, &batchBackend{
			name: "postgres", q: env.q("gc"), typ: env.typ("GC"), table: env.effectTable(t),
			options: env.options,
			db:      func(*bus.Bus) *gorm.DB { return env.db },
		})
	})
}

func (be *batchBackend) effects(t *testing.T, b *bus.Bus) map[string]int {
	t.Helper()
	var rows []effect
	if err := be.db(b).Table(be.table).Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.MessageID]++
	}
	return out
}

// batchProbe starts a bus whose endpoint has one handler slot (one worker,
// BatchDeliveriesPerHandler deliveries in hand) and whose consumer blocks
// on the message "gate" until released: the deliveries published
// meanwhile wait for the worker and are taken as one batch.
type batchProbe struct {
	b         *bus.Bus
	gateIn    chan struct{}
	release   chan struct{}
	submitted chan string
	mu        sync.Mutex
	batches   [][]string
	calls     map[string]int // consumer runs by message id
}

func startBatchProbe(t *testing.T, be *batchBackend, consume func(ctx context.Context, d *endpoint.Delivery) error, configure ...func(e *endpoint.Endpoint)) *batchProbe {
	t.Helper()
	return startBatchProbeWith(t, be, nil, consume, configure...)
}

// startBatchProbeWith is startBatchProbe with more bus options.
func startBatchProbeWith(t *testing.T, be *batchBackend, more []bus.Option, consume func(ctx context.Context, d *endpoint.Delivery) error, configure ...func(e *endpoint.Endpoint)) *batchProbe {
	t.Helper()
	p := &batchProbe{gateIn: make(chan struct{}), release: make(chan struct{}), submitted: make(chan string, 64), calls: map[string]int{}}
	var gateOnce sync.Once
	opts := be.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(be.q, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 1
			e.Batch.MaxMessages = endpoint.DefaultBatchMaxMessages // a limit of 1 does not batch unless asked
			e.Retry = endpoint.Immediate(1)
			for _, c := range configure {
				c(e)
			}
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				p.mu.Lock()
				p.calls[d.MessageID]++
				p.mu.Unlock()
				if d.MessageID == "gate" {
					gateOnce.Do(func() { close(p.gateIn) })
					<-p.release
				}
				if err := bus.TxFromContext(ctx).Table(be.table).Create(&effect{MessageID: d.MessageID, Consumer: be.q}).Error; err != nil {
					return err
				}
				return consume(ctx, d)
			}, endpoint.ForTypes(be.typ))
		})
	}, func(o *outbox.Options) { o.InboxLockTimeout = time.Minute })
	sig := newBusSignal() // so that waitStats works
	b, err := bus.New(append(append(opts, more...), bus.WithObserver(sig.fire))...)
	if err != nil {
		t.Fatal(err)
	}
	bus.SetBatchHooksForTest(b, func(_ string, ids []string) {
		p.mu.Lock()
		p.batches = append(p.batches, slices.Clone(ids))
		p.mu.Unlock()
	}, func(id string) { p.submitted <- id })
	busSignals.Store(b, sig)
	t.Cleanup(func() { busSignals.Delete(b) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		select {
		case <-p.release:
		default:
			close(p.release) // a failed test must not leave the gate consumer blocking Stop
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	p.b = b
	if be.name == "sqlite" {
		if err := p.b.DB().Table(be.table).AutoMigrate(&effect{}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// publishBatch publishes gate, waits for its consumer to hold the worker,
// publishes ids, waits until every one waits for the worker, and releases
// the gate: the worker then takes ids as one batch.
func (p *batchProbe) publishBatch(t *testing.T, be *batchBackend, ids ...string) {
	t.Helper()
	pub := func(id string) {
		t.Helper()
		if err := p.b.Publish(context.Background(), bus.Raw{Type: be.typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			t.Fatal(err)
		}
	}
	pub("gate")
	select {
	case <-p.gateIn:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate message did not reach its consumer")
	}
	for _, id := range ids {
		pub(id)
	}
	want := len(ids) + 1 // the gate's own
	for range want {
		select {
		case <-p.submitted:
		case <-time.After(10 * time.Second):
			t.Fatal("the batch's deliveries did not all reach the workers")
		}
	}
	close(p.release)
}

// sawBatch reports whether one batch held exactly ids (in any order).
func (p *batchProbe) sawBatch(ids ...string) ([][]string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := slices.Sorted(slices.Values(ids))
	for _, b := range p.batches {
		if slices.Equal(slices.Sorted(slices.Values(b)), want) {
			return p.batches, true
		}
	}
	return p.batches, false
}

// TestGroupCommitFailureIsolated: in one batch, a consumer that fails after
// its write is rolled back to its savepoint and retried alone (its effect
// once), a poison message is dead-lettered with no effect, and their
// neighbour commits.
func TestGroupCommitFailureIsolated(t *testing.T) {
	batchBackends(t, func(t *testing.T, be *batchBackend) {
		var flakyCalls atomic.Int32
		p := startBatchProbe(t, be, func(_ context.Context, d *endpoint.Delivery) error {
			switch d.MessageID {
			case "flaky":
				if flakyCalls.Add(1) == 1 {
					return errors.New("first attempt fails after its write")
				}
			case "poison":
				return endpoint.Permanent(errors.New("poison fails after its write"))
			}
			return nil
		})
		p.publishBatch(t, be, "a", "flaky", "poison")
		waitStats(t, p.b, func(s bus.Stats) bool { return s.Consumed == 3 && s.DeadLettered == 1 })
		if batches, ok := p.sawBatch("a", "flaky", "poison"); !ok {
			t.Fatalf("batches %v: want one holding a, flaky and poison", batches)
		}
		got := be.effects(t, p.b)
		want := map[string]int{"gate": 1, "a": 1, "flaky": 1}
		if !mapsEqual(got, want) {
			t.Fatalf("effects %v, want %v (the failed attempts rolled back, their neighbours committed)", got, want)
		}
		p.mu.Lock()
		calls := maps.Clone(p.calls)
		p.mu.Unlock()
		// a ran once: its batch committed around the failures.
		if want := map[string]int{"gate": 1, "a": 1, "flaky": 2, "poison": 1}; !mapsEqual(calls, want) {
			t.Fatalf("consumer runs %v, want %v", calls, want)
		}
		if n := processedEntries(t, p.b, "poison"); n != 0 {
			t.Fatalf("poison has %d processed inbox entries, want 0", n)
		}
	})
}

// TestDatabaseCutMidTransaction: PostgreSQL becomes unreachable in the
// middle of a consumer transaction (after a consumer's write, before the
// COMMIT) and comes back 3 s later, in a batch of three (group commit) and
// for a message alone (group commit off). Every message has its effect
// once, nothing is dead-lettered, and the locks the failed transaction
// could not release do not hold the retries until InboxLockTimeout (1 min
// here): each delivery releases its own before trying again. A message
// published after the outage flows too.
func TestDatabaseCutMidTransaction(t *testing.T) {
	for _, batched := range []bool{true, false} {
		name := map[bool]string{true: "batch", false: "alone"}[batched]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			amqpEnv := newRealEnv(t)
			pg := newPgEnv(t)
			pgDB, proxy := proxied(t, pg)
			table := "effects_cut_" + pg.suffix
			if err := pg.db.Table(table).AutoMigrate(&effect{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pg.db.Exec(`DROP TABLE IF EXISTS "` + table + `"`) })
			be := &batchBackend{
				name: "postgres", q: amqpEnv.q("cut"), typ: amqpEnv.typ("Cut"), table: table,
				options: func(declare func(*endpoint.Endpoints), more ...func(*outbox.Options)) []bus.Option {
					return append(pgOutbox(pg, pgDB, more...), quiet(),
						bus.WithTransport(rabbitmq.New(amqpEnv.url, func(c *rabbitmq.Config) { declare(&c.Endpoints) })))
				},
				db: func(*bus.Bus) *gorm.DB { return pg.db }, // around the proxy
			}
			const outage = 3 * time.Second
			var (
				cutOnce sync.Once
				upAt    = make(chan time.Time, 1)
			)
			p := startBatchProbe(t, be, func(_ context.Context, d *endpoint.Delivery) error {
				if d.MessageID == "b" { // its write is in the transaction
					cutOnce.Do(func() {
						if proxy.Down() == 0 {
							t.Error("no database connection through the proxy to cut")
						}
						time.AfterFunc(outage, func() { proxy.Up(); upAt <- time.Now() })
					})
				}
				return nil
			}, func(e *endpoint.Endpoint) {
				if !batched {
					e.Batch.MaxMessages = 1
				}
			})
			want := map[string]int{"b": 1}
			if batched {
				p.publishBatch(t, be, "a", "b", "c") // BatchDeliveriesPerHandler with the gate
				want = map[string]int{"gate": 1, "a": 1, "b": 1, "c": 1}
			} else if err := p.b.Publish(context.Background(), bus.Raw{Type: be.typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "b"}); err != nil {
				t.Fatal(err)
			}
			var up time.Time
			select {
			case up = <-upAt:
			case <-time.After(30 * time.Second):
				t.Fatal("the message never reached b's consumer")
			}
			deadline := up.Add(30 * time.Second)
			for got := be.effects(t, p.b); !mapsEqual(got, want); got = be.effects(t, p.b) {
				if time.Now().After(deadline) {
					t.Fatalf("effects %v 30 s after the database came back, want %v; stats %+v", got, want, p.b.Stats())
				}
				time.Sleep(50 * time.Millisecond)
			}
			recovered := time.Since(up)
			if batched {
				if batches, ok := p.sawBatch("a", "b", "c"); !ok {
					t.Fatalf("batches %v: want one holding a, b and c", batches)
				}
			}
			// Well inside InboxLockTimeout: the kept locks were released.
			if recovered > 15*time.Second {
				t.Errorf("effects complete %v after the database came back", recovered)
			}
			if err := p.b.Publish(context.Background(), bus.Raw{Type: be.typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: "after"}); err != nil {
				t.Fatal(err)
			}
			want["after"] = 1
			waitStats(t, p.b, func(s bus.Stats) bool { return s.Consumed >= int64(len(want)) })
			if got := be.effects(t, p.b); !mapsEqual(got, want) {
				t.Fatalf("effects %v, want %v", got, want)
			}
			if s := p.b.Stats(); s.DeadLettered != 0 {
				t.Fatalf("stats %+v: an outage must not dead-letter", s)
			}
			p.mu.Lock()
			calls := maps.Clone(p.calls)
			p.mu.Unlock()
			t.Logf("outage %v mid-transaction (%s): all effects once %v after the database came back; consumer runs %v", outage, name, recovered.Round(time.Millisecond), calls)
		})
	}
}

// TestGroupCommitDuplicateInBatch: the same message id twice in one batch
// has its effect once; the repeat is absorbed as a duplicate.
func TestGroupCommitDuplicateInBatch(t *testing.T) {
	batchBackends(t, func(t *testing.T, be *batchBackend) {
		p := startBatchProbe(t, be, func(context.Context, *endpoint.Delivery) error { return nil })
		p.publishBatch(t, be, "dup", "dup", "c")
		waitStats(t, p.b, func(s bus.Stats) bool { return s.Consumed == 3 && s.Duplicates == 1 })
		if batches, ok := p.sawBatch("dup", "dup", "c"); !ok {
			t.Fatalf("batches %v: want one holding dup twice and c", batches)
		}
		got := be.effects(t, p.b)
		if want := map[string]int{"gate": 1, "dup": 1, "c": 1}; !mapsEqual(got, want) {
			t.Fatalf("effects %v, want %v", got, want)
		}
	})
}

// TestGroupCommitCountsBatches: Stats and barewire.consumer.batch.size
// count the transactions group commit ran and the messages in them: the
// gate alone (the per-message path, a batch of one), then the three
// messages that waited behind it in one transaction.
func TestGroupCommitCountsBatches(t *testing.T) {
	batchBackends(t, func(t *testing.T, be *batchBackend) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		p := startBatchProbeWith(t, be, []bus.Option{bus.WithMeterProvider(mp)}, func(context.Context, *endpoint.Delivery) error { return nil })
		p.publishBatch(t, be, "a", "b", "c")
		waitStats(t, p.b, func(s bus.Stats) bool { return s.Consumed == 4 })
		if batches, ok := p.sawBatch("a", "b", "c"); !ok {
			t.Fatalf("batches %v: want one holding a, b and c", batches)
		}
		if s := p.b.Stats(); s.Batches != 2 || s.BatchedMessages != 4 {
			t.Fatalf("Stats: %d batches of %d messages, want 2 of 4 (the gate alone, then a, b, c)", s.Batches, s.BatchedMessages)
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		var sizes []int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "barewire.consumer.batch.size" {
					continue
				}
				h, ok := m.Data.(metricdata.Histogram[int64])
				if !ok {
					t.Fatalf("%s has data %T", m.Name, m.Data)
				}
				for _, dp := range h.DataPoints {
					if ep, _ := dp.Attributes.Value("endpoint"); ep.AsString() != be.q {
						t.Fatalf("batch size recorded with endpoint %q, want %q", ep.AsString(), be.q)
					}
					min, _ := dp.Min.Value()
					max, _ := dp.Max.Value()
					sizes = append(sizes, int64(dp.Count), dp.Sum, min, max)
				}
			}
		}
		if want := []int64{2, 4, 1, 3}; !slices.Equal(sizes, want) {
			t.Fatalf("barewire.consumer.batch.size count, sum, min, max = %v, want %v", sizes, want)
		}
	})
}

// TestGroupCommitMaxDurationSplitsBatch: once a batch has run
// Batch.MaxDuration, the messages not started go in the next transaction
// (and count in Stats.Batches there):
// with a bound that has always passed, the first message of the batch has
// committed (it is visible from another connection) before the next one's
// consumer runs; with the default bound it has not.
func TestGroupCommitMaxDurationSplitsBatch(t *testing.T) {
	for _, c := range []struct {
		name          string
		bound         time.Duration
		wantCommitted bool
		wantBatches   int64 // transactions: the gate's, then x and y's (one, or one each)
	}{{"bound-passed", time.Nanosecond, true, 3}, {"default", 0, false, 2}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := newRealEnv(t)
			be := &batchBackend{name: "postgres", q: env.q("gcdur"), typ: env.typ("GCDur"), table: env.effectTable(t),
				options: env.options, db: func(*bus.Bus) *gorm.DB { return env.db }}
			var mu sync.Mutex
			var order []string
			seen := map[string]int64{} // message → effects of the batch's first message visible outside
			p := startBatchProbe(t, be, func(_ context.Context, d *endpoint.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				if len(order) > 1 { // order[0] is the gate
					var n int64
					if err := env.db.Table(be.table).Where("message_id = ?", order[1]).Count(&n).Error; err != nil {
						return err
					}
					seen[d.MessageID] = n
				}
				order = append(order, d.MessageID)
				return nil
			}, func(e *endpoint.Endpoint) { e.Batch.MaxDuration = c.bound })
			p.publishBatch(t, be, "x", "y")
			waitStats(t, p.b, func(s bus.Stats) bool { return s.Consumed == 3 })
			if _, ok := p.sawBatch("x", "y"); !ok {
				t.Fatalf("batches %v: want one holding x and y", p.batches)
			}
			mu.Lock()
			defer mu.Unlock()
			second := order[2]
			if got := seen[second] == 1; got != c.wantCommitted {
				t.Fatalf("when %s's consumer ran, %s's effect was visible outside: %v, want %v", second, order[1], got, c.wantCommitted)
			}
			if st := p.b.Stats(); st.Batches != c.wantBatches || st.BatchedMessages != 3 {
				t.Fatalf("Stats: %d transactions of %d messages, want %d of 3 (a message not started counts in the transaction it runs in)", st.Batches, st.BatchedMessages, c.wantBatches)
			}
		})
	}
}

// TestGroupCommitOff: Batch.MaxMessages = 1 processes every message alone.
func TestGroupCommitOff(t *testing.T) {
	t.Parallel()
	batches := 0
	var mu sync.Mutex
	rec := newRecorder()
	b, err := bus.New(quiet(), inprocEndpoint("gc-off", func(e *endpoint.Endpoint) {
		e.Batch.MaxMessages = 1
		endpoint.Consumer(e, paymentConsumer("gc-off", rec))
	}))
	if err != nil {
		t.Fatal(err)
	}
	bus.SetBatchHooksForTest(b, func(string, []string) { mu.Lock(); batches++; mu.Unlock() }, nil)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Stop(context.Background()) }()
	for i := range 20 {
		if err := b.Publish(context.Background(), PaymentReceived{PaymentID: fmt.Sprint(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	rec.wait(t, 20)
	mu.Lock()
	defer mu.Unlock()
	if batches != 0 {
		t.Fatalf("%d batches with MaxMessages 1, want none", batches)
	}
}

// TestGroupCommitLimitOneKeepsOrder: an endpoint with
// ConcurrentMessageLimit 1 and the default Batch does not group-commit: it
// handles one message at a time, in queue order (a batch would hold several
// deliveries and could run them out of order).
func TestGroupCommitLimitOneKeepsOrder(t *testing.T) {
	t.Parallel()
	const n = 60
	var mu sync.Mutex
	var order []string
	batches, running, maxRunning := 0, 0, 0
	done := make(chan struct{})
	b, err := bus.New(quiet(), inprocEndpoint("gc-limit-one", func(e *endpoint.Endpoint) {
		e.ConcurrentMessageLimit, e.PrefetchCount = 1, 1
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
			mu.Lock()
			running++
			maxRunning = max(maxRunning, running)
			mu.Unlock()
			time.Sleep(time.Millisecond) // widen the window for an overlap
			mu.Lock()
			defer mu.Unlock()
			running--
			order = append(order, c.Message.PaymentID)
			if len(order) == n {
				close(done)
			}
			return nil
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	bus.SetBatchHooksForTest(b, func(string, []string) { mu.Lock(); batches++; mu.Unlock() }, nil)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Stop(context.Background()) }()
	for i := range n {
		if err := b.Publish(context.Background(), PaymentReceived{PaymentID: fmt.Sprint(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("not every message was handled within 30s")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, id := range order {
		if id != fmt.Sprint(i) {
			t.Fatalf("handled in order %v; want publish order", order)
		}
	}
	if batches != 0 || maxRunning != 1 {
		t.Fatalf("%d batches, %d consumers at once; want none and 1", batches, maxRunning)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestGroupCommitSurvivesSIGKILL: a child process (this test binary, re-run)
// consumes with group commit and is killed with SIGKILL while a batch's
// transaction is open (one consumer of it blocks); a bus started afterwards
// on the same database and queue gives every message its effect exactly once.
func TestGroupCommitSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	table := env.effectTable(t)
	q, typ := env.q("gckill"), env.typ("GCKill")
	const n = 60
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BW_GC_CHILD=1", "BW_GC_DSN="+testenv.PostgresDSN(t), "BW_GC_AMQP="+env.url,
		"BW_GC_PREFIX="+env.prefix, "BW_GC_QUEUE="+q, "BW_GC_TYPE="+typ, "BW_GC_TABLE="+table, "BW_GC_BLOCK=m-40")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	lines := bufio.NewReader(out)
	expect := func(prefix string) string {
		t.Helper()
		line, err := lines.ReadString('\n')
		if err != nil || len(line) < len(prefix) || line[:len(prefix)] != prefix {
			t.Fatalf("child said %q, %v; want %q...", line, err, prefix)
		}
		return line
	}
	expect("started")

	pubBus := start(t, env.options(func(*endpoint.Endpoints) {})...)
	for i := range n {
		if err := pubBus.Publish(context.Background(), bus.Raw{Type: typ, Body: []byte(`{}`)}, bus.Headers{bus.HeaderMessageID: fmt.Sprintf("m-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	line := expect("blocked")
	t.Logf("child: %s", line[:len(line)-1])
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true

	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, recordEffect(table, q), endpoint.ForTypes(typ))
		})
	}, func(o *outbox.Options) { o.InboxLockTimeout = 2 * time.Second })...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := env.effects(t, table)
		if len(got) == n {
			for i := range n {
				if k := got[[2]string{fmt.Sprintf("m-%d", i), q}]; k != 1 {
					t.Errorf("m-%d: %d effects, want 1", i, k)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages have an effect 60s after the kill", len(got), n)
		}
		time.Sleep(50 * time.Millisecond) // database state: no signal exists
	}
	drain(t, b)
	for k, v := range env.effects(t, table) {
		if v != 1 {
			t.Errorf("%v: %d effects after draining, want 1", k, v)
		}
	}
}

// groupCommitChild is TestGroupCommitSurvivesSIGKILL's child: it consumes
// with group commit, says "started", then "blocked" when the consumer of
// BW_GC_BLOCK holds its batch's transaction open, and waits to be killed.
func groupCommitChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "group commit child:", err)
		os.Exit(2)
	}
	db, err := postgresdb.Open(os.Getenv("BW_GC_DSN"))
	if err != nil {
		fail(err)
	}
	q, typ, table, block := os.Getenv("BW_GC_QUEUE"), os.Getenv("BW_GC_TYPE"), os.Getenv("BW_GC_TABLE"), os.Getenv("BW_GC_BLOCK")
	var batchMu sync.Mutex
	batchOf := map[string]int{}
	b, err := bus.New(quiet(), bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) {
			o.TablePrefix = os.Getenv("BW_GC_PREFIX")
			o.InboxLockTimeout = 2 * time.Second
		}),
		bus.WithTransport(rabbitmq.New(os.Getenv("BW_GC_AMQP"), func(c *rabbitmq.Config) {
			c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = 2
				endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
					if err := bus.TxFromContext(ctx).Table(table).Create(&effect{MessageID: d.MessageID, Consumer: q}).Error; err != nil {
						return err
					}
					if d.MessageID == block {
						batchMu.Lock()
						size := batchOf[block]
						batchMu.Unlock()
						fmt.Printf("blocked in a batch of %d\n", size)
						select {} // until SIGKILL, the transaction open
					}
					return nil
				}, endpoint.ForTypes(typ))
			})
		})))
	if err != nil {
		fail(err)
	}
	bus.SetBatchHooksForTest(b, func(_ string, ids []string) {
		batchMu.Lock()
		for _, id := range ids {
			batchOf[id] = len(ids)
		}
		batchMu.Unlock()
	}, nil)
	if err := b.Start(context.Background()); err != nil {
		fail(err)
	}
	fmt.Println("started")
	select {}
}

// TestGroupCommitStatementCanceledKeepsNeighbours (issue 32, defect 3): in a
// batch on PostgreSQL, a consumer whose statement is canceled by its own
// context (a timeout inside SQL) made pgx close the batch's connection: the
// ROLLBACK TO SAVEPOINT failed, the neighbours that had succeeded got
// "bad connection", the bus read it as an outage, paused and ran them again.
// The cancel must cost only that consumer's attempt: the neighbours commit
// on their first attempt and no outage is counted.
func TestGroupCommitStatementCanceledKeepsNeighbours(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	be := &batchBackend{
		name: "postgres", q: env.q("gc"), typ: env.typ("GC"), table: env.effectTable(t),
		options: env.options,
		db:      func(*bus.Bus) *gorm.DB { return env.db },
	}
	var slowCalls atomic.Int32
	p := startBatchProbe(t, be, func(ctx context.Context, d *endpoint.Delivery) error {
		if d.MessageID != "slow" {
			return nil
		}
		if slowCalls.Add(1) > 1 {
			return nil // the retry succeeds
		}
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return bus.TxFromContext(ctx).WithContext(sctx).Exec("SELECT pg_sleep(5)").Error
	})
	p.publishBatch(t, be, "a", "slow", "b")
	waitStats(t, p.b, func(s bus.Stats) bool { return s.Consumed == 4 })
	if batches, ok := p.sawBatch("a", "slow", "b"); !ok {
		t.Fatalf("batches %v: want one holding a, slow and b", batches)
	}
	p.mu.Lock()
	calls := maps.Clone(p.calls)
	p.mu.Unlock()
	if want := map[string]int{"gate": 1, "a": 1, "slow": 2, "b": 1}; !mapsEqual(calls, want) {
		t.Errorf("consumer runs %v, want %v: the neighbours of a canceled statement must commit on their first attempt", calls, want)
	}
	if got, want := be.effects(t, p.b), map[string]int{"gate": 1, "a": 1, "slow": 1, "b": 1}; !mapsEqual(got, want) {
		t.Errorf("effects %v, want %v", got, want)
	}
	if n := bus.OutagesForTest(p.b); n != 0 {
		t.Errorf("%d database outages for a consumer's canceled statement; want 0", n)
	}
}
