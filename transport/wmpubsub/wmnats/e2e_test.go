package wmnats_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub/internal/e2etest"
	preset "github.com/barewire-go/barewire/transport/wmpubsub/wmnats"
)

// TestEndToEnd runs the bus on JetStream with the inbox and outbox on
// PostgreSQL. The Slow case holds a message past a 1s AckWait: JetStream
// delivers it again while the first delivery runs.
func TestEndToEnd(t *testing.T) {
	url := testenv.NATSURL(t)
	e2etest.Run(t, e2etest.Config{
		New: func(t *testing.T, slow bool, declare func(*endpoint.Endpoints)) transport.Factory {
			return preset.New(url, func(c *preset.Config) {
				declare(&c.Endpoints)
				if slow {
					c.AckWait = time.Second
				}
			})
		},
		Inject: func(t *testing.T, topic string, msg *message.Message) {
			pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
				URL: url, Marshaler: &wmnats.NATSMarshaler{}, JetStream: wmnats.JetStreamConfig{AutoProvision: true},
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			if err := pub.Publish(topic, msg); err != nil {
				t.Fatal(err)
			}
		},
		TypeTopic: preset.Name,
		// The type's stream holds one message and discards new ones:
		// JetStream refuses every publish ("maximum messages exceeded").
		Refuse: func(t *testing.T, topic string) {
			conn, err := nats.Connect(url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			js, err := conn.JetStream()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.AddStream(&nats.StreamConfig{Name: topic, Subjects: []string{topic}, MaxMsgs: 1, Discard: nats.DiscardNew}); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(topic, []byte("fill")); err != nil {
				t.Fatal(err)
			}
		},
		QueueTopicExists: func(t *testing.T, queue string) bool {
			conn, err := nats.Connect(url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			js, err := conn.JetStream()
			if err != nil {
				t.Fatal(err)
			}
			_, err = js.StreamInfo(preset.Name("q:" + queue))
			if err != nil && !errors.Is(err, nats.ErrStreamNotFound) {
				t.Fatal(err)
			}
			return err == nil
		},
		Slow:            true,
		DedupsPublishes: true,
		Cleanup: func(t *testing.T, queues, types []string) {
			deleteStreams(t, url, queues, append(types, typesDirect(types)...))
		},
	})
}

func typesDirect(types []string) []string {
	var out []string
	for _, t := range types {
		out = append(out, t+".direct")
	}
	return out
}
