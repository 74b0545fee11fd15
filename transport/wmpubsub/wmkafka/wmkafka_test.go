package wmkafka_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmkafka"
)

func TestName(t *testing.T) {
	for in, want := range map[string]string{
		"PaymentReceived": "PaymentReceived",
		"orders.v1-x":     "orders.v1-x",
		"a b":             "a_20b",
		"a_b":             "a_5fb",
		"a/b:c":           "a_2fb_3ac",
	} {
		if got := wmkafka.Name(in); got != want {
			t.Errorf("Name(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBuildDoesNoIO builds the transport against an address where no
// broker listens: Build validates and connects to nothing, and Close
// without Start succeeds.
func TestBuildDoesNoIO(t *testing.T) {
	f := wmkafka.New([]string{"127.0.0.1:1"}, func(c *wmkafka.Config) {
		c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil })
		})
	})
	if errs := f.Endpoints().Errs(); len(errs) > 0 {
		t.Fatal(errs)
	}
	tr, err := f.Build(transport.Env{Logger: slog.New(slog.DiscardHandler), RelayLease: time.Minute})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("Close before Start: %v", err)
	}
}
