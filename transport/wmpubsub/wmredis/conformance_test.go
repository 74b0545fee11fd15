package wmredis_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/tcpproxy"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/transporttest"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmredis"
)

// TestMain checks for leaked goroutines. watermill-redisstream's read loop
// sleeps 500ms after a read fails (a canceled subscription's last read
// does) before it sees its context, and nothing can wait for it: the check
// gives such a goroutine up to 2s to end.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(2 * time.Second)
		for {
			err := goleak.Find()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
				code = 1
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.Exit(code)
}

func deleteStreams(t *testing.T, addr string, queues, types []string) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	var keys []string
	for _, q := range queues {
		keys = append(keys, wmredis.QueuePrefix+q)
	}
	keys = append(keys, types...)
	if err := c.Del(context.Background(), keys...).Err(); err != nil {
		t.Logf("cleanup: %v", err)
	}
}

// TestConformance runs the seam's conformance suite on the local Redis. A
// short MaxIdleTime lets the next instance claim the delivery in flight at
// Close within the suite's timeout.
func TestConformance(t *testing.T) {
	addr := testenv.RedisAddr(t)
	px, err := tcpproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	transporttest.Run(t, transporttest.Config{
		New: func(t *testing.T, declare func(*endpoint.Endpoints)) transport.Factory {
			return wmredis.New(px.Addr(), func(c *wmredis.Config) {
				declare(&c.Endpoints)
				c.MaxIdleTime = time.Second
				c.ClaimInterval = 500 * time.Millisecond
				c.NackResendSleep = 10 * time.Millisecond
			})
		},
		Durable: true,
		// Every connection of the transport goes through the proxy.
		Reconnect: func(t *testing.T, _ transport.Transport) {
			if px.Cut() == 0 {
				t.Fatal("no connection through the proxy to cut")
			}
		},
		Cleanup: func(t *testing.T, queues, types []string) { deleteStreams(t, addr, queues, types) },
	})
}
