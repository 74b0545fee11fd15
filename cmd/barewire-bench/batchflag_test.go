package main

import (
	"testing"

	"github.com/barewire-go/barewire/endpoint"
)

// TestBatchFlag: -batch sets the BareWire endpoint's Batch.MaxMessages (1
// turns group commit off); 0 leaves the bus's default. The other flags the
// endpoint takes (-consumers, -prefetch) go along.
func TestBatchFlag(t *testing.T) {
	for _, c := range []struct {
		batch, want int
		batching    bool
	}{{0, endpoint.DefaultBatchMaxMessages, true}, {1, 1, false}, {5, 5, true}} {
		p := &barewirePipe{cfg: &config{consumers: 4, prefetch: 2, batch: c.batch}, inbox: endpoint.InboxTwoPhase, queue: "bench.q", typ: "BenchOrder"}
		var eps endpoint.Endpoints
		eps.ReceiveEndpoint(p.queue, p.configure)
		if errs := eps.Errs(); len(errs) > 0 {
			t.Fatalf("-batch %d: %v", c.batch, errs)
		}
		e := eps.List()[0]
		if e.Batch.MaxMessages != c.want || e.BatchEnabled() != c.batching {
			t.Errorf("-batch %d: MaxMessages %d, group commit %v; want %d, %v", c.batch, e.Batch.MaxMessages, e.BatchEnabled(), c.want, c.batching)
		}
		if e.ConcurrentMessageLimit != 4 || e.PrefetchCount != 8 {
			t.Errorf("-batch %d: ConcurrentMessageLimit %d, PrefetchCount %d; want 4, 8", c.batch, e.ConcurrentMessageLimit, e.PrefetchCount)
		}
	}
}
