package bus_test

import (
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// cluster drives the test cluster's nodes through the script.
type cluster struct {
	t      *testing.T
	script string
	urls   []string
}

func (c *cluster) run(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.script, args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", c.script, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// answers reports whether node n (1-based) accepts an AMQP connection.
func (c *cluster) answers(n int) bool {
	conn, err := amqp.DialConfig(c.urls[n-1], amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// waitOnline waits (up to 3 minutes) until every node runs a member of the
// quorum queue, so that the node loss the test causes is one of three
// members, not the second of a queue whose third member is still
// recovering (a node started just before the test, or by another run).
// Each rabbitmqctl call may take 45 s: on a loaded machine starting its
// Erlang VM alone took more than 20 s (a CI run found 0 of 3 members
// online after 90 s of calls that all timed out).
func (c *cluster) waitOnline(queue string) {
	c.t.Helper()
	const wait = 3 * time.Minute
	deadline := time.Now().Add(wait)
	online := 0
	for {
		for n := 1; n <= len(c.urls) && online < len(c.urls); n++ {
			ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
			out, err := exec.CommandContext(ctx, c.script, "ctl", fmt.Sprint(n), "-q", "list_queues", "name", "online", "--no-table-headers").Output()
			cancel()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) > 0 && f[0] == queue {
					online = strings.Count(line, "@")
				}
			}
			break
		}
		if online >= len(c.urls) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("queue %s has %d of %d members online after %v", queue, online, len(c.urls), wait)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nodeOf returns the node number (1-based) of a URL the transport reports
// (redacted), by its host:port.
func (c *cluster) nodeOf(redacted string) int {
	for i, u := range c.urls {
		_, hostPart, _ := strings.Cut(u, "@")
		host, _, _ := strings.Cut(hostPart, "/")
		if strings.Contains(redacted, "@"+host+"/") {
			return i + 1
		}
	}
	return 0
}

// TestClusterNodeLoss runs two bus instances (each with its outbox relay,
// its producers and a consumer of one quorum-queue endpoint) on a 3-node
// RabbitMQ cluster, kills the node both are connected to — the queue's
// leader — with SIGKILL while they publish and consume, and starts it
// again. It checks that every message committed by a producer has exactly
// one effect (0 lost, 0 doubled, 0 phantom), that no producer transaction
// failed, and reports the reconnect time per instance and the throughput
// before, during and after the loss.
func TestClusterNodeLoss(t *testing.T) {
	urls := testenv.AMQPClusterURLs(t)
	dsn := testenv.PostgresDSN(t)
	if len(urls) < 3 {
		t.Fatalf("%s lists %d nodes; the test needs 3", testenv.AMQPClusterVar, len(urls))
	}
	cl := &cluster{t: t, script: testenv.ClusterScript(t), urls: urls}
	for n := 1; n <= len(urls); n++ {
		if !cl.answers(n) {
			t.Logf("node %d is down: starting it", n)
			cl.run("start-node", fmt.Sprint(n))
		}
	}

	admin, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := admin.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() }) // after the schema is dropped
	_, schemaDSN := testenv.PostgresSchema(t, sqlDB, dsn)
	db, err := postgresdb.Open(schemaDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})
	if err := db.Exec(`CREATE TABLE effects (msg_id text NOT NULL, instance text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`).Error; err != nil {
		t.Fatal(err)
	}

	suffix := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	queue, typ := "cluster-"+suffix, "ClusterEvent-"+suffix
	type event struct{ N int }

	// Instance A tries the nodes in order 1,2,3, B in order 1,3,2: both
	// start on node 1 (which therefore leads the queue A declares) and
	// fail over to different nodes.
	orders := [][]int{{1, 2, 3}, {1, 3, 2}}
	names := []string{"A", "B"}
	trs := make([]*rabbitmq.Transport, len(orders))
	buses := make([]*bus.Bus, len(orders))
	for i, order := range orders {
		var list []string
		for _, n := range order {
			list = append(list, urls[n-1])
		}
		instance := names[i]
		trs[i] = rabbitmq.New(strings.Join(list, ","), func(c *rabbitmq.Config) {
			c.QueueType = endpoint.Quorum
			c.ReconnectMaxInterval = time.Second
			c.ConnectTimeout = 30 * time.Second
			c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = 8
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[event]) error {
					return bus.TxFromContext(ctx).Exec(`INSERT INTO effects (msg_id, instance) VALUES (?, ?)`, c.MessageID, instance).Error
				}, endpoint.AsMessageType(typ))
			})
		})
		buses[i] = start(t, quiet(), bus.WithTransport(trs[i]), bus.WithDatabase(db),
			bus.WithOutbox(func(o *outbox.Options) { o.PollingInterval = 100 * time.Millisecond }))
	}
	t.Cleanup(func() { // the queues live on the cluster, not on the shared broker
		conn, err := amqp.Dial(urls[1])
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(queue+"_error", false, false, false)
			_ = ch.ExchangeDelete(typ, false, false)
		}
	})

	// Producers: two per instance, each committing one message per
	// transaction, about 100 per second each.
	var (
		committed sync.Map // message id -> true
		nCommit   atomic.Int64
		txFails   atomic.Int64
		firstFail atomic.Pointer[string]
	)
	pctx, stopProducers := context.WithCancel(context.Background())
	var pwg sync.WaitGroup
	for i, b := range buses {
		for p := 0; p < 2; p++ {
			pwg.Add(1)
			go func() {
				defer pwg.Done()
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for n := 0; ; n++ {
					select {
					case <-pctx.Done():
						return
					case <-tick.C:
					}
					id := fmt.Sprintf("%s-%d-%d-%s", names[i], p, n, suffix)
					err := db.Transaction(func(tx *gorm.DB) error {
						return b.PublishTx(pctx, tx, event{N: n}, bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: typ})
					})
					if err != nil {
						if pctx.Err() != nil {
							return
						}
						txFails.Add(1)
						msg := err.Error()
						firstFail.CompareAndSwap(nil, &msg)
						continue
					}
					committed.Store(id, true)
					nCommit.Add(1)
				}
			}()
		}
	}
	defer func() { stopProducers(); pwg.Wait() }()

	effects := func() int64 {
		var n int64
		if err := db.Raw(`SELECT count(*) FROM effects`).Scan(&n).Error; err != nil {
			t.Errorf("count effects: %v", err)
		}
		return n
	}
	// phase runs for d and returns the consumption rate (effects/s).
	phase := func(d time.Duration) float64 {
		e0, t0 := effects(), time.Now()
		time.Sleep(d)
		return float64(effects()-e0) / time.Since(t0).Seconds()
	}

	// Warm up until both instances consume.
	deadline := time.Now().Add(30 * time.Second)
	for effects() < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("nothing consumed within 30s (committed %d)", nCommit.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := phase(4 * time.Second)

	cl.waitOnline(queue)
	victim := cl.nodeOf(trs[0].Node())
	if victim == 0 {
		t.Fatalf("instance A is connected to %q, not to a cluster node", trs[0].Node())
	}
	leader := cl.run("leader", queue)
	if leader != fmt.Sprint(victim) {
		t.Logf("the queue's leader is node %s, not the victim node %d", leader, victim)
	}
	connected := make([]bool, len(trs))
	for i, tr := range trs {
		connected[i] = cl.nodeOf(tr.Node()) == victim
	}
	connects := make([]int64, len(trs))
	for i, tr := range trs {
		connects[i] = tr.Connects()
	}

	t.Logf("killing node %d (instance A's; queue leader: node %s)", victim, leader)
	// Reconnect time per instance that was on the victim: from the kill
	// (counted from just before the script looks the VM up and kills it)
	// to a new connection with the topology declared (Node is set then).
	var killedAt time.Time // the database's clock, for the effects' times
	if err := db.Raw(`SELECT clock_timestamp()`).Scan(&killedAt).Error; err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var reconnects []time.Duration
	back := make([]time.Duration, len(trs)) // per instance: reconnected after
	var rmu sync.Mutex
	var rwg sync.WaitGroup
	for i, tr := range trs {
		if !connected[i] {
			continue
		}
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for time.Since(killed) < 30*time.Second {
				if tr.Connects() > connects[i] && tr.Node() != "" {
					d := time.Since(killed)
					rmu.Lock()
					reconnects = append(reconnects, d)
					back[i] = d
					rmu.Unlock()
					t.Logf("instance %s reconnected to %s %v after the kill", names[i], tr.Node(), d.Round(time.Millisecond))
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Errorf("instance %s did not reconnect within 30s of the kill", names[i])
		}()
	}
	cl.run("kill-node", fmt.Sprint(victim))
	during := phase(6 * time.Second)
	rwg.Wait()
	restarted := time.Now()
	cl.run("start-node", fmt.Sprint(victim))
	t.Logf("node %d started again in %v", victim, time.Since(restarted).Round(time.Millisecond))
	after := phase(4 * time.Second)

	stopProducers()
	pwg.Wait()
	total := nCommit.Load()
	deadline = time.Now().Add(60 * time.Second)
	for effects() < total {
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Consuming again: each instance's first effect committed after it
	// reconnected (deliveries in flight at the kill may commit before),
	// looked up once the run is over so that a slow resume is measured,
	// not mistaken for none; the bound is 15 s after the loss.
	var agains []time.Duration
	for i, name := range names {
		var first sql.NullTime
		since := killedAt.Add(back[i])
		if err := db.Raw(`SELECT min(at) FROM effects WHERE instance = ? AND at > ?`, name, since).Scan(&first).Error; err != nil {
			t.Fatal(err)
		}
		if !first.Valid {
			t.Errorf("instance %s consumed nothing after it reconnected", name)
			continue
		}
		again := first.Time.Sub(killedAt)
		t.Logf("instance %s consuming again %.2fs after the kill (reconnected after %.2fs)", name, again.Seconds(), back[i].Seconds())
		agains = append(agains, again)
		if again > 15*time.Second {
			t.Errorf("instance %s consumed again only %.2fs after the kill; the bound is 15s", name, again.Seconds())
		}
	}

	// The checker: every committed message has exactly one effect.
	var ids []string
	if err := db.Raw(`SELECT msg_id FROM effects`).Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, id := range ids {
		seen[id]++
	}
	var lost, doubled, phantom []string
	committed.Range(func(k, _ any) bool {
		if seen[k.(string)] == 0 {
			lost = append(lost, k.(string))
		}
		return true
	})
	for id, n := range seen {
		if n > 1 {
			doubled = append(doubled, id)
		}
		if _, ok := committed.Load(id); !ok {
			phantom = append(phantom, id)
		}
	}
	var dups int64
	for _, b := range buses {
		dups += b.Stats().Duplicates
	}
	slices.Sort(reconnects)
	p50, maxR := time.Duration(0), time.Duration(0)
	if len(reconnects) > 0 {
		p50, maxR = reconnects[(len(reconnects)-1)/2], reconnects[len(reconnects)-1]
	}
	t.Logf("cluster summary: committed %d, effects %d, lost %d, doubled %d, phantom %d, duplicates absorbed by the inbox %d, producer transactions failed %d",
		total, len(ids), len(lost), len(doubled), len(phantom), dups, txFails.Load())
	t.Logf("cluster summary: reconnect after node loss p50 %.2fs max %.2fs (%d instances); throughput (effects/s) before %.0f, during %.0f, after %.0f",
		p50.Seconds(), maxR.Seconds(), len(reconnects), before, during, after)
	if len(lost)+len(doubled)+len(phantom) > 0 {
		t.Errorf("lost %v, doubled %v, phantom %v", head(lost), head(doubled), head(phantom))
		// Where the queue stands: a message the broker dropped is neither
		// ready nor unacknowledged (the list runs on node 2, which the
		// test never kills).
		t.Logf("queues (name, ready, unacknowledged, consumers, leader):\n%s",
			cl.run("ctl", "2", "-q", "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers", "leader", "--no-table-headers"))
		// Where each lost message stopped: its outbox row (never relayed,
		// or marked delivered on a broker confirm) and its inbox entry.
		for _, id := range head(lost) {
			var rows []struct {
				Status      string
				Attempts    int
				LastError   string
				CreatedAt   time.Time
				DeliveredAt sql.NullTime
			}
			_ = db.Raw(`SELECT status, attempts, last_error, created_at, delivered_at FROM barewire_outbox WHERE message_id = ?`, id).Scan(&rows).Error
			var entries []struct {
				ConsumerType string
				ProcessedAt  sql.NullTime
				Attempts     int
			}
			_ = db.Raw(`SELECT consumer_type, processed_at, attempts FROM barewire_inbox WHERE message_id = ?`, id).Scan(&entries).Error
			t.Logf("lost %s (kill at %s): outbox %+v; inbox %+v", id, killedAt.Format("15:04:05.000"), rows, entries)
		}
	}
	if n := txFails.Load(); n > 0 {
		t.Errorf("%d producer transactions failed while a node was lost; first: %s", n, *firstFail.Load())
	}
	if len(reconnects) == 0 {
		t.Error("no instance reconnected")
	}
	if p50 > 5*time.Second || maxR > 15*time.Second {
		t.Errorf("reconnect p50 %v max %v; targets 5s and 15s", p50, maxR)
	}
	// Consuming again, not only connected: at 56f7633 both instances
	// reconnected in 0.9 s but consumed nothing new for 12.6 s, their
	// relays' publishes nacked by the quorum queue (see the transport's
	// releasePublisher).
	slices.Sort(agains)
	if len(agains) > 0 && agains[(len(agains)-1)/2] > 5*time.Second {
		t.Errorf("consuming again after the kill: p50 %v; the target is 5s", agains[(len(agains)-1)/2])
	}
	for i, b := range buses {
		rep := b.CheckHealth(context.Background())
		for _, c := range rep.Checks {
			if c.Name == bus.HealthCheckTransport && (c.Status != "pass" || c.Details["node"] == "") {
				t.Errorf("instance %s transport health: %+v", names[i], c)
			}
		}
	}
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}
