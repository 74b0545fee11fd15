package wmredis_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmredis"
)

// TestEveryConsumerGetsAConnection: each competing consumer of an endpoint
// reads its queue's stream and its type's with a blocking XREADGROUP, each
// holding a connection of the queue's subscriber client. With PoolSize
// unset that client must have room for all of them at once: it once had
// go-redis's default of 10 per CPU (New handed Options to a client that
// filled in its defaults, and the subscribers copied them), so the
// consumers queued for connections and the endpoint moved one message per
// consumer every two BlockTimes (160 msg/s at 1 % CPU in barewire-bench).
func TestEveryConsumerGetsAConnection(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := "bw-pool-" + uuid.NewString()[:8]
	queue, typ := name+"-q", name+"-T"
	b, err := bus.New(bus.WithSQLite(filepath.Join(t.TempDir(), "bw.db")), bus.WithTransport(wmredis.New(addr, func(c *wmredis.Config) {
		c.Options.ClientName = name
		c.Prefix = name + ":"
		c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 8
			endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil }, endpoint.ForTypes(typ))
		})
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer scancel()
		if err := b.Stop(sctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		deleteStreams(t, addr, nil, []string{name + ":" + wmredis.QueuePrefix + queue, name + ":" + typ, name + ":" + wmredis.QueuePrefix + queue + "_error"})
	})
	// Group commit on (SQLite's inbox batches): 8 × BatchDeliveriesPerHandler
	// consumers, each reading two streams.
	want := 2 * 8 * endpoint.BatchDeliveriesPerHandler
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	reading := 0
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		reading = 0
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " cmd=xreadgroup") {
				reading++
			}
		}
		if reading >= want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%d connections of the endpoint's consumers read at once, want %d (one per consumer and stream)", reading, want)
}
