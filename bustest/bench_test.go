package bustest_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/inproc"
)

// BenchmarkNewCleanup is a test's fixed cost: a harness with the two
// endpoints of orders on the embedded default, started and stopped
// (leak check included).
func BenchmarkNewCleanup(b *testing.B) {
	for b.Loop() {
		ft := &fakeT{}
		bustest.New(ft, orders(endpoint.NoRetry()))
		ft.runCleanups()
		if len(ft.errs) > 0 {
			b.Fatal(ft.errs)
		}
	}
}

// BenchmarkRoundTrip is publish, consume, and the wait that sees it.
func BenchmarkRoundTrip(b *testing.B) {
	h := bustest.New(b, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error { return nil })
		})
	})))
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		id := strconv.Itoa(i)
		if err := h.Bus.Publish(ctx, OrderPlaced{ID: id}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			b.Fatal(err)
		}
		bustest.Consumed[OrderPlaced](h, bustest.WithID(id))
	}
}

// TestManyParallelHarnesses runs BUSTEST_PARALLEL (default 20) tests in
// parallel, each a harness with two endpoints and one order through the
// outbox: the shape of a user's suite.
func TestManyParallelHarnesses(t *testing.T) {
	n := 20
	if v := os.Getenv("BUSTEST_PARALLEL"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("BUSTEST_PARALLEL=%q: want a positive number", v)
		}
	}
	for i := range n {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			h := start(t, endpoint.NoRetry())
			if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: fmt.Sprint(i)}, nil); err != nil {
				t.Fatal(err)
			}
			bustest.Consumed[InvoiceIssued](h, bustest.OnEndpoint("mail"))
			h.WaitIdle()
		})
	}
}
