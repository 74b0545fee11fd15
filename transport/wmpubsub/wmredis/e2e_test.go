package wmredis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub/internal/e2etest"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmredis"
)

// TestEndToEnd runs the bus on Redis Streams with the inbox and outbox on
// PostgreSQL. The Slow case holds a message past a 1s MaxIdleTime: another
// subscription claims it (XPENDING + XCLAIM) while the first delivery runs.
// The message without a UUID is an XADD with no _watermill_message_uuid
// field at all, which watermill-redisstream's own unmarshaller refuses
// (leaving it pending, to be claimed again and again).
func TestEndToEnd(t *testing.T) {
	addr := testenv.RedisAddr(t)
	e2etest.Run(t, e2etest.Config{
		New: func(t *testing.T, slow bool, declare func(*endpoint.Endpoints)) transport.Factory {
			return wmredis.New(addr, func(c *wmredis.Config) {
				declare(&c.Endpoints)
				c.MaxIdleTime = 10 * time.Second
				if slow {
					// Above the inbox's one-second re-check of a copy that
					// arrives while its original runs (DepartedConsumers): a
					// copy still waiting for it must not idle into a claim
					// (seen once under CI load with 1s); below the Slow
					// case's 3s hold.
					c.MaxIdleTime = 2 * time.Second
					c.ClaimInterval = 200 * time.Millisecond
				}
			})
		},
		Inject: func(t *testing.T, topic string, msg *message.Message) {
			if msg.UUID == "" {
				c := redis.NewClient(&redis.Options{Addr: addr})
				defer c.Close()
				if err := c.XAdd(context.Background(), &redis.XAddArgs{Stream: topic, Values: map[string]any{"payload": []byte(msg.Payload)}}).Err(); err != nil {
					t.Fatal(err)
				}
				return
			}
			pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(&redis.Options{Addr: addr})}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			if err := pub.Publish(topic, msg); err != nil {
				t.Fatal(err)
			}
		},
		TypeTopic: func(typ string) string { return typ },
		// The type's key holds a string: Redis refuses every XADD to it
		// (WRONGTYPE).
		Refuse: func(t *testing.T, topic string) {
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			if err := c.Set(context.Background(), topic, "not a stream", 0).Err(); err != nil {
				t.Fatal(err)
			}
		},
		QueueTopicExists: func(t *testing.T, queue string) bool {
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			n, err := c.Exists(context.Background(), wmredis.QueuePrefix+queue).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n > 0
		},
		// A consumer "departed" reads the entries into its pending list
		// (XREADGROUP, no XACK) and is never heard from again.
		Orphan: func(t *testing.T, topic, group string, msgs ...*message.Message) {
			ctx := context.Background()
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			if err := c.XGroupCreateMkStream(ctx, topic, group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
				t.Fatal(err)
			}
			for _, m := range msgs {
				values, err := wmredis.Marshaller{}.Marshal(topic, m)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			read, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "departed", Streams: []string{topic, ">"}, Count: int64(len(msgs)), Block: -1}).Result()
			if err != nil || len(read) != 1 || len(read[0].Messages) != len(msgs) {
				t.Fatalf("XREADGROUP as the departed consumer: %v, %v", read, err)
			}
		},
		Slow: true,
		Cleanup: func(t *testing.T, queues, types []string) {
			var direct []string
			for _, x := range types {
				direct = append(direct, x+".direct")
			}
			deleteStreams(t, addr, queues, append(types, direct...))
		},
	})
}
