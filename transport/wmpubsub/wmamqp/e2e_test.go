package wmamqp_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub/internal/e2etest"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmamqp"
)

// TestEndToEnd runs the bus through watermill-amqp with the inbox and
// outbox on PostgreSQL. RabbitMQ does not redeliver a message its consumer
// holds, so the Slow case is skipped. The message without a UUID comes
// from watermill-amqp's own durable pub/sub publisher and default marshaler.
func TestEndToEnd(t *testing.T) {
	url := testenv.AMQPURL(t)
	e2etest.Run(t, e2etest.Config{
		New: func(t *testing.T, _ bool, declare func(*endpoint.Endpoints)) transport.Factory {
			return wmamqp.New(url, func(c *wmamqp.Config) { declare(&c.Endpoints) })
		},
		Inject: func(t *testing.T, topic string, msg *message.Message) {
			pub, err := wamqp.NewPublisher(wamqp.NewDurablePubSubConfig(url, nil), watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			if err := pub.Publish(topic, msg); err != nil {
				t.Fatal(err)
			}
		},
		TypeTopic: func(typ string) string { return typ },
		// The type's exchange routes to a full queue that rejects new
		// messages: the broker nacks every publish.
		Refuse: func(t *testing.T, topic string) {
			conn, err := amqp.Dial(url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			full := topic + ".full"
			t.Cleanup(func() { deleteTopology(t, url, []string{full}, []string{topic}) })
			if err := ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": 1, "x-overflow": "reject-publish"}); err != nil {
				t.Fatal(err)
			}
			if err := ch.QueueBind(full, "", topic, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			dc, err := ch.PublishWithDeferredConfirm("", full, false, false, amqp.Publishing{Body: []byte("fill")})
			if err != nil || !dc.Wait() {
				t.Fatalf("fill the full queue: %v", err)
			}
		},
		QueueTopicExists: func(t *testing.T, queue string) bool {
			conn, err := amqp.Dial(url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			var ae *amqp.Error
			if err != nil && !(errors.As(err, &ae) && ae.Code == amqp.NotFound) {
				t.Fatal(err)
			}
			if err == nil {
				_ = ch.Close()
			}
			return err == nil
		},
		Cleanup: func(t *testing.T, queues, types []string) {
			var direct []string
			for _, x := range types {
				direct = append(direct, x+".direct")
			}
			deleteTopology(t, url, queues, append(types, direct...))
		},
	})
}
