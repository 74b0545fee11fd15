package bus_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// orderEffect is one committed effect of the scale test's consumer. Its id
// is drawn inside the consumer's transaction, after the previous message
// of the key committed, so ordering by id is ordering by processing.
type orderEffect struct {
	ID       int64 `gorm:"primaryKey"`
	Key      string
	Seq      int
	Instance string
}

// orderingScale returns the scale test's size: 100 keys × 30 messages by
// default (CI); BW_ORDERING_KEYS and BW_ORDERING_PER change it (the
// opt-in long run, make test-ordering-long, is 100 × 200).
func orderingScale(t *testing.T) (keys, per int) {
	keys, per = 100, 30
	for env, v := range map[string]*int{"BW_ORDERING_KEYS": &keys, "BW_ORDERING_PER": &per} {
		if s := os.Getenv(env); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", env, s)
			}
			*v = n
		}
	}
	return keys, per
}

// TestOrderedAcrossInstancesWithKills: 100 keys × 30 messages (× 200 in
// the long run), written
// to the outbox in transactions of one message per key (so several relays,
// the parent's and every instance's, claim them per-key FIFO), consumed by
// an ordered endpoint (8 partitions, single active consumer each) on three
// instances, each its own process. The instance that committed the latest
// effect is SIGKILLed at a third and at two thirds of the run and replaced;
// its unacknowledged messages are redelivered to the instance that takes
// its partitions over, and some messages fail their first attempt and are
// retried in process. Checker: every key's effects are its messages
// 0..per-1, each once, in publish order.
func TestOrderedAcrossInstancesWithKills(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	keys, per := orderingScale(t)
	total := keys * per
	queue, typ := env.q("ordered-scale"), env.typ("OrderStep")
	env.orderedCleanup(t, queue, orderingPartitions)
	table := "order_effects_" + env.suffix
	env.tables = append(env.tables, table)
	if err := env.db.Table(table).AutoMigrate(&orderEffect{}); err != nil {
		t.Fatal(err)
	}
	opts := func(more ...func(*outbox.Options)) []bus.Option {
		return env.options(func(*endpoint.Endpoints) {}, append(more, orderingOutboxOptions)...)
	}
	// The parent only publishes; its relay is one of several.
	pub := start(t, opts()...)

	children := map[string]*exec.Cmd{}
	var mu sync.Mutex
	startChild := func(name string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "BW_ORDER_CHILD="+name, "BW_ORDER_QUEUE="+queue, "BW_ORDER_TYPE="+typ,
			"BW_ORDER_TABLE="+table, "BW_ORDER_PREFIX="+env.prefix, "BW_ORDER_DSN="+testenvDSN(t), "BW_ORDER_AMQP="+env.url)
		stdin, err := cmd.StdinPipe() // the child exits when it closes
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
			t.Fatalf("instance %s said %q, %v", name, line, err)
		}
		mu.Lock()
		children[name] = cmd
		mu.Unlock()
	}
	for i := range 3 {
		startChild(fmt.Sprintf("i%d", i))
	}

	began := time.Now()
	ctx := context.Background()
	published := make(chan error, 1)
	go func() {
		for seq := range per {
			err := pub.Transaction(ctx, func(tx *gorm.DB) error {
				for k := range keys {
					key := fmt.Sprintf("key-%03d", k)
					if err := pub.PublishTx(ctx, tx, OrderStep{Key: key, Seq: seq},
						bus.OrderingKey(key, bus.Headers{bus.HeaderMessageType: typ})); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				published <- err
				return
			}
		}
		published <- nil
	}()

	count := func() (n int64, last string) {
		var r struct {
			N    int64
			Last sql.NullString
		}
		env.db.Raw(`SELECT count(*) AS n, (SELECT instance FROM "` + table + `" ORDER BY id DESC LIMIT 1) AS last FROM "` + table + `"`).Scan(&r)
		return r.N, r.Last.String
	}
	// No signal crosses the processes: poll the effects table, bounded.
	deadline := time.Now().Add(5 * time.Minute)
	waitEffects := func(n int64) string {
		t.Helper()
		for {
			got, last := count()
			if got >= n {
				return last
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d effects after %v", got, total, time.Since(began))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	kills := 0
	for i, at := range []int64{int64(total) / 3, 2 * int64(total) / 3} {
		victim := waitEffects(at)
		mu.Lock()
		cmd := children[victim]
		delete(children, victim)
		mu.Unlock()
		if cmd == nil {
			t.Fatalf("no running instance %q", victim)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		kills++
		startChild(fmt.Sprintf("r%d", i))
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	waitEffects(int64(total))
	elapsed := time.Since(began)
	// Let redeliveries of what was already processed settle, then check
	// that nothing more arrives: duplicates would show up as extra rows.
	time.Sleep(2 * time.Second)

	var rows []orderEffect
	if err := env.db.Table(table).Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	instances := map[string]int{}
	for _, r := range rows {
		if r.Seq != next[r.Key] {
			t.Fatalf("key %s: effect of message %d where %d was due (doubled, lost or out of order)", r.Key, r.Seq, next[r.Key])
		}
		next[r.Key]++
		instances[r.Instance]++
	}
	if len(rows) != total || len(next) != keys {
		t.Fatalf("%d effects for %d keys, want %d for %d", len(rows), len(next), total, keys)
	}
	t.Logf("%d keys × %d messages in order, exactly once, in %v (%.0f msg/s) with %d SIGKILLs; effects per instance: %v",
		keys, per, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), kills, instances)
}

// orderingPartitions is the scale test endpoint's partition count.
const orderingPartitions = 8

// orderingOutboxOptions: a short inbox lock, so that a message whose
// instance was killed mid-handler is taken over quickly by the next one.
func orderingOutboxOptions(o *outbox.Options) {
	o.InboxLockTimeout = 2 * time.Second
	o.PollingInterval = 200 * time.Millisecond
}

func testenvDSN(t *testing.T) string { return os.Getenv("BAREWIRE_TEST_POSTGRES_DSN") }

// orderChild is an instance of TestOrderedAcrossInstancesWithKills: a bus
// with the ordered endpoint; it says "started" and runs until its stdin
// closes (the parent ends) or it is killed.
func orderChild() {
	name := os.Getenv("BW_ORDER_CHILD")
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "ordering instance %s: %v\n", name, err)
		os.Exit(2)
	}
	db, err := postgresdb.Open(os.Getenv("BW_ORDER_DSN"))
	if err != nil {
		fail(err)
	}
	table, typ := os.Getenv("BW_ORDER_TABLE"), os.Getenv("BW_ORDER_TYPE")
	b, err := bus.New(quiet(), bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = os.Getenv("BW_ORDER_PREFIX"); orderingOutboxOptions(o) }),
		bus.WithTransport(rabbitmq.New(os.Getenv("BW_ORDER_AMQP"), func(c *rabbitmq.Config) {
			c.ReceiveEndpoint(os.Getenv("BW_ORDER_QUEUE"), func(e *endpoint.Endpoint) {
				e.Ordered(orderingPartitions)
				e.Retry = endpoint.Immediate(3)
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderStep]) error {
					if c.Message.Seq%23 == 5 && c.Attempt == 1 {
						return fmt.Errorf("transient failure of %s/%d", c.Message.Key, c.Message.Seq)
					}
					return bus.TxFromContext(ctx).Table(table).Create(&orderEffect{Key: c.Message.Key, Seq: c.Message.Seq, Instance: name}).Error
				}, endpoint.AsMessageType(typ))
			})
		})))
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		fail(err)
	}
	fmt.Println("started")
	_, _ = io.Copy(io.Discard, os.Stdin)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = b.Stop(sctx)
	os.Exit(0)
}
