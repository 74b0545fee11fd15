package wmamqp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
	"github.com/barewire-go/barewire/transport/wmpubsub"
)

// Config configures the preset: the receive endpoints and the queues'
// settings.
type Config struct {
	endpoint.Endpoints

	// QueueArgs are the arguments every endpoint queue is declared with
	// (for instance {"x-queue-type": "quorum"}); they must match those of
	// a queue that already exists. Defaults to none (classic queues).
	QueueArgs map[string]any
	// PrefetchCount is each consumer's prefetch. Defaults to 1, as
	// watermill-amqp handles one message at a time per subscription.
	PrefetchCount int
}

// queueTopic marks the topic of a queue: sent through the default
// exchange with the queue as routing key.
const queueTopic = "queue:"

// New returns a factory for bus.WithTransport running the bus through
// watermill-amqp on the RabbitMQ at url. configure declares the receive
// endpoints and may set Config's fields; it may be nil.
func New(url string, configure func(c *Config)) transport.Factory {
	var c Config
	if configure != nil {
		configure(&c)
	}
	if c.PrefetchCount <= 0 {
		c.PrefetchCount = 1
	}
	config := func(queue string) wamqp.Config {
		cfg := wamqp.NewDurablePubSubConfig(url, func(string) string { return queue })
		cfg.Marshaler = Marshaler{}
		cfg.Exchange.GenerateName = func(topic string) string {
			if strings.HasPrefix(topic, queueTopic) {
				return "" // the default exchange
			}
			return topic
		}
		cfg.Publish.GenerateRoutingKey = func(topic string) string {
			q, _ := strings.CutPrefix(topic, queueTopic)
			if q == topic {
				return ""
			}
			return q
		}
		cfg.Publish.ConfirmDelivery = true
		cfg.Queue.Arguments = amqp.Table(c.QueueArgs)
		cfg.Consume.Qos.PrefetchCount = c.PrefetchCount
		return cfg
	}
	var (
		mu   sync.Mutex
		conn *wamqp.ConnectionWrapper
	)
	connection := func(ctx context.Context) (*wamqp.ConnectionWrapper, error) {
		mu.Lock()
		defer mu.Unlock()
		if conn != nil {
			return conn, nil
		}
		for {
			cw, err := wamqp.NewConnection(wamqp.ConnectionConfig{AmqpURI: url}, watermill.NopLogger{})
			if err == nil {
				conn = cw
				return conn, nil
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("wmamqp: connect: %w", err)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return wmpubsub.New(func(w *wmpubsub.Config) {
		w.Endpoints = c.Endpoints
		w.System = "rabbitmq"
		w.Topics = wmpubsub.Topics{
			Type:  func(s string) string { return s },
			Queue: func(s string) string { return queueTopic + s },
		}
		w.Semantics = wmpubsub.Semantics{NackRedelivers: true}
		w.Publisher = func(ctx context.Context) (message.Publisher, error) {
			cw, err := connection(ctx)
			if err != nil {
				return nil, err
			}
			return wamqp.NewPublisherWithConnection(config(""), watermill.NopLogger{}, cw)
		}
		w.Subscriber = func(ctx context.Context, queue string) (message.Subscriber, error) {
			cw, err := connection(ctx)
			if err != nil {
				return nil, err
			}
			return wamqp.NewSubscriberWithConnection(config(queue), watermill.NopLogger{}, cw)
		}
		w.Health = func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if conn == nil || !conn.IsConnected() {
				return errors.New("wmamqp: not connected to RabbitMQ")
			}
			return nil
		}
		w.OnClose = func() error {
			mu.Lock()
			defer mu.Unlock()
			if conn == nil {
				return nil
			}
			return conn.Close()
		}
	})
}

// Marshaler writes and reads transport/rabbitmq's wire format, plus the
// _watermill_message_uuid header watermill-amqp's DefaultMarshaler reads.
// Unmarshal never fails (a header that is not a string, such as a quorum
// queue's x-delivery-count, is rendered as one), so that no delivery is
// nacked and requeued in a loop for its headers.
type Marshaler struct{}

// Marshal maps the message's metadata onto AMQP properties and headers.
func (Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	md := msg.Metadata
	m := &outbox.Message{
		MessageID:     msg.UUID,
		MessageType:   md.Get(wire.HeaderMessageType),
		ContentType:   md.Get(wire.HeaderContentType),
		CorrelationID: md.Get(wire.HeaderCorrelationID),
		Payload:       msg.Payload,
		Headers:       map[string]string(md),
	}
	_, _, pub := rabbitmq.PublishingFor(m)
	if pub.Headers == nil {
		pub.Headers = amqp.Table{}
	}
	if msg.UUID != "" {
		pub.Headers[wire.HeaderWatermillUUID] = msg.UUID
	}
	return pub, nil
}

// Unmarshal reads a delivery as transport/rabbitmq does.
func (Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	return rabbitmq.MessageFromDelivery(&d), nil
}
