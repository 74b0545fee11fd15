package wmnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmnats"
)

// TestDurableOutlivesAStoppedInstance: an instance that stops gracefully
// leaves its endpoint's durable consumers in place for its competitors.
// (nats.go deletes a consumer its subscription created at Unsubscribe:
// the next subscription would have made a new one and received every
// message the stream retains again.)
func TestDurableOutlivesAStoppedInstance(t *testing.T) {
	url := testenv.NATSURL(t)
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	ep, typ := "dur-"+hex.EncodeToString(raw[:]), "Dur"+hex.EncodeToString(raw[:])
	t.Cleanup(func() { deleteStreams(t, url, []string{ep, ep + "_error"}, []string{typ}) })
	fac := wmnats.New(url, func(c *wmnats.Config) {
		c.ReceiveEndpoint(ep, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(context.Context, *endpoint.Context[struct{}]) error { return nil }, endpoint.AsMessageType(typ))
		})
	})
	tr, err := fac.Build(transport.Env{Logger: slog.New(slog.DiscardHandler), RelayLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.Start(ctx, fac.Endpoints().List()); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	if _, err := tr.Subscriber().Subscribe(sctx, ep); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	conn, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	js, err := conn.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{wmnats.Name("q:" + ep), wmnats.Name(typ)} {
		durable := wmnats.Name("q:"+ep) + "__" + stream
		if _, err := js.ConsumerInfo(stream, durable); err != nil {
			t.Errorf("durable %q on %q after the instance stopped: %v", durable, stream, err)
		}
	}
}
