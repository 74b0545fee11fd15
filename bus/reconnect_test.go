package bus_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
)

// closeOurConnections force-closes, from the broker side, every AMQP
// connection this test process opened, as an operator or a network fault
// would. It returns how many it closed.
func closeOurConnections(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "list_connections", "--quiet", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	mark := fmt.Sprintf("pid %d\"", os.Getpid())
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if !ok || !strings.Contains(props, mark) {
			continue
		}
		if out, err := exec.Command("rabbitmqctl", "close_connection", strings.TrimSpace(pid), "fault injected by test").CombinedOutput(); err != nil {
			t.Logf("close_connection %s: %v %s", pid, err, out)
			continue
		}
		n++
	}
	return n
}

// TestRabbitConnectionsForceClosedMidRun is not parallel: it closes every
// connection of this process, and runs while the parallel tests wait.
func TestRabbitConnectionsForceClosedMidRun(t *testing.T) {
	env := newRealEnv(t)
	table := env.effectTable(t)
	typ := env.typ("Resilient")
	q := env.q("resilient")
	total := 10_000
	if testing.Short() {
		total = 2_000
	}
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 8
			e.PrefetchCount = 32
			endpoint.RawConsumer(e, recordEffect(table, q), endpoint.ForTypes(typ))
		})
	})...)
	ctx := context.Background()
	closed := 0
	for i := 0; i < total; i += 100 {
		err := b.Transaction(ctx, func(tx *gorm.DB) error {
			for j := i; j < i+100; j++ {
				id := fmt.Sprintf("r-%s-%d", env.suffix, j)
				if err := b.PublishTx(ctx, tx, bus.Raw{Type: typ, Body: []byte(id)}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if batch := i / 100; batch == total/300 || batch == 2*total/300 {
			closed += closeOurConnections(t)
		}
	}
	if closed == 0 {
		t.Fatal("no connection was closed: the fault was not injected")
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var n int64
		if err := env.db.Table(table).Distinct("message_id").Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		if n == int64(total) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages consumed after the connections were closed; stats %+v", n, total, b.Stats())
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := env.effects(t, table)
	for k, n := range got {
		if n != 1 {
			t.Fatalf("%v applied %d times", k, n)
		}
	}
	st, err := b.OutboxStore().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages, %d connections force-closed, all consumed once; stats %+v; outbox %+v", total, closed, b.Stats(), st)
}
