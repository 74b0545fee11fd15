package wmkafka

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

// Config configures the preset: the receive endpoints and the Kafka
// settings.
type Config struct {
	endpoint.Endpoints

	// Prefix is put in front of every topic and consumer group name.
	// Defaults to "".
	Prefix string
	// NackResendSleep is how long a nacked message waits before it is
	// delivered again (blocking its partition). Defaults to 500ms.
	NackResendSleep time.Duration
	// Sarama, when set, returns the base sarama configuration of the
	// publisher (producer=true) and the subscribers (TLS, SASL, version).
	// The preset then requires all acks and idempotent production on
	// the producer and the oldest initial offset on consumers. Defaults to
	// watermill-kafka's.
	Sarama func(producer bool) *sarama.Config
}

// New returns a factory for bus.WithTransport running the bus on the Kafka
// brokers. configure declares the receive endpoints and may set Config's
// fields; it may be nil.
func New(brokers []string, configure func(c *Config)) transport.Factory {
	var c Config
	if configure != nil {
		configure(&c)
	}
	if c.NackResendSleep <= 0 {
		c.NackResendSleep = 500 * time.Millisecond
	}
	saramaConfig := func(producer bool) *sarama.Config {
		if c.Sarama != nil {
			return c.Sarama(producer)
		}
		if producer {
			return kafka.DefaultSaramaSyncPublisherConfig()
		}
		return kafka.DefaultSaramaSubscriberConfig()
	}
	return wmpubsub.New(func(w *wmpubsub.Config) {
		w.Endpoints = c.Endpoints
		w.System = "kafka"
		w.Topics = wmpubsub.Topics{
			Type:  func(s string) string { return c.Prefix + Name(s) },
			Queue: func(s string) string { return c.Prefix + QueuePrefix + Name(s) },
		}
		w.Semantics = wmpubsub.Semantics{NackRedelivers: true, AckPerOffset: true}
		w.Publisher = func(context.Context) (message.Publisher, error) {
			sc := saramaConfig(true)
			sc.Producer.RequiredAcks = sarama.WaitForAll
			sc.Producer.Return.Successes = true
			return kafka.NewPublisher(kafka.PublisherConfig{
				Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
			}, watermill.NopLogger{})
		}
		w.Subscriber = func(_ context.Context, queue string) (message.Subscriber, error) {
			sc := saramaConfig(false)
			sc.Consumer.Offsets.Initial = sarama.OffsetOldest
			return kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers:               brokers,
				Unmarshaler:           kafka.DefaultMarshaler{},
				OverwriteSaramaConfig: sc,
				ConsumerGroup:         c.Prefix + Name(queue),
				NackResendSleep:       c.NackResendSleep,
			}, watermill.NopLogger{})
		}
	})
}

// QueuePrefix is put in front of a queue's topic name (message types keep
// theirs, so that a Watermill-native service publishing to the topic
// PaymentReceived reaches the endpoints consuming PaymentReceived).
const QueuePrefix = "queue."

// Name returns s as a Kafka topic name: letters, digits, '.' and '-' stay,
// every other byte becomes _xx (its hex value), so that distinct names stay
// distinct.
func Name(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '.' {
			b.WriteByte(ch)
			continue
		}
		fmt.Fprintf(&b, "_%02x", ch)
	}
	return b.String()
}
