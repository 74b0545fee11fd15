package inproc_test

import (
	"testing"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/transporttest"
)

func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Config{
		New: func(t *testing.T, declare func(*endpoint.Endpoints)) transport.Factory {
			return inproc.New(func(c *inproc.Config) { declare(&c.Endpoints) })
		},
		NackGoesBehind: true,
		// The in-process transport's "connection" is its hand-over to
		// consumers: DropConnection takes back unsettled deliveries.
		Reconnect: func(t *testing.T, tr transport.Transport) {
			if err := tr.(transport.ConnDropper).DropConnection(); err != nil {
				t.Fatal(err)
			}
		},
	})
}
