package wmredis

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

// Config configures the preset: the receive endpoints and the Redis
// settings.
type Config struct {
	endpoint.Endpoints

	// Options are the go-redis options of every client the preset opens;
	// New sets Addr. Each subscriber and the publisher get a client of
	// their own (watermill-redisstream closes it with them). A queue's
	// subscriber client serves every competing consumer of the queue in
	// this process, and each of them holds a connection for each stream it
	// reads (its queue's and one per consumed type) while XREADGROUP
	// blocks, and needs another for each XACK: when PoolSize is 0 that
	// client gets SubscriberPoolSize connections, not go-redis's 10 per
	// CPU, whose wait for a free connection held every consumer up. A
	// PoolSize you set is used as it is.
	Options redis.Options
	// Consumer names this instance in every consumer group. Keep it
	// stable across restarts and distinct between instances, so that the
	// group does not fill up with dead consumers. Defaults to the host
	// name and the process id.
	Consumer string
	// Prefix is put in front of every stream name. Defaults to "".
	Prefix string
	// MaxIdleTime is how long a message may stay unacknowledged before
	// another subscription claims it. Keep it above your slowest consumer:
	// a claimed message still being processed is handed back by the inbox
	// until the first delivery finishes. Defaults to 60s.
	MaxIdleTime time.Duration
	// ClaimInterval is how often pending messages are looked for.
	// Defaults to 5s.
	ClaimInterval time.Duration
	// NackResendSleep is how long a nacked message waits before it is
	// delivered again. Defaults to 500ms.
	NackResendSleep time.Duration
	// MaxLen caps each stream (XADD MAXLEN ~); 0 keeps every message.
	// Defaults to 0.
	MaxLen int64
}

// SubscriberPoolSize is the most connections a queue's subscriber client
// opens when Config.Options.PoolSize is 0: room for several endpoints'
// worth of competing consumers, each holding a connection per stream it
// reads. go-redis opens connections only as they are needed.
const SubscriberPoolSize = 1024

// New returns a factory for bus.WithTransport running the bus on the Redis
// server at addr (host:port). configure declares the receive endpoints and
// may set Config's fields; it may be nil.
func New(addr string, configure func(c *Config)) transport.Factory {
	var c Config
	if configure != nil {
		configure(&c)
	}
	c.Options.Addr = addr
	if c.Consumer == "" {
		host, _ := os.Hostname()
		c.Consumer = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.MaxIdleTime <= 0 {
		c.MaxIdleTime = 60 * time.Second
	}
	if c.ClaimInterval <= 0 {
		c.ClaimInterval = 5 * time.Second
	}
	if c.NackResendSleep <= 0 {
		c.NackResendSleep = 500 * time.Millisecond
	}
	return wmpubsub.New(func(w *wmpubsub.Config) {
		w.Endpoints = c.Endpoints
		w.System = "redis"
		w.Topics = wmpubsub.Topics{
			Type:  func(s string) string { return c.Prefix + s },
			Queue: func(s string) string { return c.Prefix + QueuePrefix + s },
		}
		w.Semantics = wmpubsub.Semantics{NackRedelivers: true}
		// NewClient fills in the defaults of the Options it is given: a
		// copy each, so that Options keeps what the caller set.
		hopts := c.Options
		health := redis.NewClient(&hopts)
		w.Publisher = func(context.Context) (message.Publisher, error) {
			opts := c.Options
			return redisstream.NewPublisher(redisstream.PublisherConfig{
				Client: redis.NewClient(&opts), Marshaller: Marshaller{}, DefaultMaxlen: c.MaxLen,
			}, watermill.NopLogger{})
		}
		w.Subscriber = func(_ context.Context, queue string) (message.Subscriber, error) {
			opts := c.Options
			if opts.PoolSize == 0 {
				opts.PoolSize = SubscriberPoolSize
			}
			sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:                        redis.NewClient(&opts),
				Unmarshaller:                  Marshaller{},
				Consumer:                      c.Consumer,
				ConsumerGroup:                 c.Prefix + queue,
				NackResendSleep:               c.NackResendSleep,
				MaxIdleTime:                   c.MaxIdleTime,
				ClaimInterval:                 c.ClaimInterval,
				OldestId:                      "0",
				DisableIndefiniteInitialBlock: true,
			}, watermill.NopLogger{})
			if err != nil {
				return nil, err
			}
			return &subscriber{Subscriber: sub, client: health, group: c.Prefix + queue}, nil
		}
		// A queue's topic is a stream, created with its consumer group by
		// the subscriber's initialization.
		w.QueueExists = func(ctx context.Context, topic string) (bool, error) {
			n, err := health.Exists(ctx, topic).Result()
			return n > 0, err
		}
		w.DeleteQueue = func(ctx context.Context, topic string) error {
			return health.Del(ctx, topic).Err()
		}
		w.Health = func(ctx context.Context) error {
			if err := health.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("wmredis: ping %s: %w", addr, err)
			}
			return nil
		}
		w.OnClose = health.Close
	})
}

// subscriber creates its consumer group (and the stream) when the adapter
// initializes a topic, so that a queue exists from its endpoint's start:
// watermill-redisstream creates the group at the first Subscribe only.
type subscriber struct {
	*redisstream.Subscriber
	client *redis.Client
	group  string
}

// SubscribeInitialize creates the group on topic from its first entry
// (XGROUP CREATE ... 0 MKSTREAM); an existing group is left as it is.
func (s *subscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.client.XGroupCreateMkStream(ctx, topic, s.group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("wmredis: create consumer group %q on %q: %w", s.group, topic, err)
	}
	return nil
}

// QueuePrefix is put in front of a queue's name to make its stream's (types
// keep their names, so that a Watermill-native service publishing to the
// topic PaymentReceived reaches the endpoints consuming PaymentReceived).
const QueuePrefix = "queue:"

// Marshaller is watermill-redisstream's default format (UUID, msgpack
// metadata, payload), read leniently: a message without a UUID is
// delivered with an empty id (for the endpoint's MissingMessageID policy)
// and one whose metadata cannot be decoded is delivered with the error in
// BW-Wire-Error, instead of staying pending and being claimed forever.
type Marshaller struct{}

// Marshal is redisstream.DefaultMarshallerUnmarshaller's.
func (Marshaller) Marshal(topic string, msg *message.Message) (map[string]any, error) {
	return redisstream.DefaultMarshallerUnmarshaller{}.Marshal(topic, msg)
}

// HeaderWireError holds why a message's metadata could not be read.
const HeaderWireError = "BW-Wire-Error"

// Unmarshal never fails.
func (Marshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	v := make(map[string]any, len(values)+1)
	for k, x := range values {
		if s, ok := x.(string); ok {
			v[k] = s
		}
	}
	if _, ok := v[redisstream.UUIDHeaderKey]; !ok {
		v[redisstream.UUIDHeaderKey] = ""
	}
	msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(v)
	if err == nil {
		return msg, nil
	}
	payload, _ := v["payload"].(string)
	msg = message.NewMessage(v[redisstream.UUIDHeaderKey].(string), []byte(payload))
	msg.Metadata.Set(HeaderWireError, err.Error())
	return msg, nil
}
