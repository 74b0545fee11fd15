package rabbitmq

import (
	"testing"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/transporttest"
)

// TestConformance runs the seam's conformance suite against the real
// broker: connections are closed from the broker side with rabbitmqctl,
// and the endpoint's queue is deleted behind the transport's back first,
// so the reconnect must declare it again.
func TestConformance(t *testing.T) {
	url := brokerURL(t)
	transporttest.Run(t, transporttest.Config{
		New: func(t *testing.T, declare func(*endpoint.Endpoints)) transport.Factory {
			return New(url, func(c *Config) { declare(&c.Endpoints) })
		},
		Durable:   true,
		Reconnect: func(t *testing.T, tr transport.Transport) { closeConnection(t, tr.(*Transport)) },
		DeleteQueue: func(t *testing.T, queue string) {
			if _, err := newPlain(t).ch().QueueDelete(queue, false, false, false); err != nil {
				t.Fatalf("delete queue %q: %v", queue, err)
			}
		},
		Cleanup: func(t *testing.T, queues, exchanges []string) {
			p := newPlain(t)
			p.cleanupQueues(queues...)
			p.cleanupExchanges(exchanges...)
		},
	})
}
