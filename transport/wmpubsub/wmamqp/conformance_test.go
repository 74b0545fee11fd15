package wmamqp_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/transporttest"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmamqp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func deleteTopology(t *testing.T, url string, queues, exchanges []string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, x := range exchanges {
		_ = ch.ExchangeDelete(x, false, false)
	}
}

// TestConformance runs the seam's conformance suite through watermill-amqp
// on the local RabbitMQ, through a TCP proxy that the reconnect case cuts.
// That case runs without -race only: watermill-amqp's reconnect races
// (see raceEnabled); CI runs it in the non-race pass of `make test`.
func TestConformance(t *testing.T) {
	url := testenv.AMQPURL(t)
	px, proxied := testenv.Proxy(t, url)
	var reconnect func(t *testing.T, _ transport.Transport)
	if !raceEnabled { // see raceEnabled: the race is watermill-amqp's
		// Every connection of the transport goes through the proxy.
		reconnect = func(t *testing.T, _ transport.Transport) {
			if px.Cut() == 0 {
				t.Fatal("no connection through the proxy to cut")
			}
		}
	}
	transporttest.Run(t, transporttest.Config{
		Reconnect: reconnect,
		New: func(t *testing.T, declare func(*endpoint.Endpoints)) transport.Factory {
			return wmamqp.New(proxied, func(c *wmamqp.Config) { declare(&c.Endpoints) })
		},
		Durable: true,
		Cleanup: func(t *testing.T, queues, exchanges []string) { deleteTopology(t, url, queues, exchanges) },
	})
}
