//go:build !race

// Not under -race: watermill-amqp v3.0.2's reconnect races (see
// race_test.go); CI runs this in the non-race pass of `make test`.

package wmamqp

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/internal/testenv"
)

// TestPublisherSurvivesConnectionCuts publishes from 8 goroutines while the
// connection is cut under them ten times. watermill-amqp's channel pool
// shared between publishes loses a channel for good whenever a reopen
// meets the dead connection, until Publish blocks for ever; its Close then
// panics on the lost channel, and a publish taking a channel that is being
// closed panics too (both seen with a shared pool of 4). Through
// publisher: no panic, every Publish returns within a bound, every
// goroutine publishes again after each cut, and Close returns.
func TestPublisherSurvivesConnectionCuts(t *testing.T) {
	url := testenv.AMQPURL(t)
	px, proxied := testenv.Proxy(t, url)

	queue := "wmamqp-publisher-cuts-" + watermill.NewShortUUID()
	direct, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ch, err := direct.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()

	conn, err := wamqp.NewConnection(wamqp.ConnectionConfig{AmqpURI: proxied}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := wamqp.NewDurablePubSubConfig(proxied, nil)
	cfg.Marshaler = Marshaler{}
	cfg.Exchange.GenerateName = func(string) string { return "" }
	cfg.Publish.GenerateRoutingKey = func(string) string { return queue }
	cfg.Publish.ConfirmDelivery = true
	pub := newPublisher(conn, cfg)

	const workers = 8
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		oks      [workers]atomic.Int64
		slowest  atomic.Int64
		failures atomic.Int64
	)
	defer stop.Store(true) // on a failure too: the workers end with the test
	for w := range workers {
		wg.Go(func() {
			for !stop.Load() {
				start := time.Now()
				err := pub.Publish("q", message.NewMessage(watermill.NewUUID(), []byte("x")))
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
				if err != nil {
					failures.Add(1)
					time.Sleep(5 * time.Millisecond) // back off as the relay would
					continue
				}
				oks[w].Add(1)
			}
		})
	}
	// A Publish that blocks for ever (the pool drained) would hang wg.Wait:
	// the deadline below turns that into a failure with a stack dump.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	go func() {
		<-ctx.Done()
		if ctx.Err() == context.DeadlineExceeded {
			panic("publishes still blocked after 90 s")
		}
	}()

	waitAll := func(what string) {
		base := make([]int64, workers)
		for i := range base {
			base[i] = oks[i].Load()
		}
		deadline := time.Now().Add(20 * time.Second)
		for i := range workers {
			for oks[i].Load() <= base[i] {
				if time.Now().After(deadline) {
					t.Fatalf("%s: worker %d published nothing for 20 s (failures so far %d)", what, i, failures.Load())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	waitAll("before the cuts")
	for i := range 10 {
		if px.Cut() == 0 {
			t.Fatalf("cut %d: no connection through the proxy", i)
		}
		waitAll("after a cut")
	}
	stop.Store(true)
	wg.Wait()
	if err := pub.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	cancel()
	var total int64
	for i := range workers {
		total += oks[i].Load()
	}
	t.Logf("%d publishes confirmed, %d failed during the cuts, slowest publish %s", total, failures.Load(), time.Duration(slowest.Load()))
	if d := time.Duration(slowest.Load()); d > 15*time.Second {
		t.Errorf("a publish took %s", d)
	}
}
