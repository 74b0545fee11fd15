package rabbitmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

type paymentReceived struct {
	PaymentID string `json:"payment_id"`
}

// TestWatermillNativePublisherConsumedOnceByEachEndpoint publishes with
// watermill-amqp v3 as a Watermill-native service does (its durable pub/sub
// config and default marshaler, topic = the message type; once with the
// `name` metadata of Watermill's CQRS marshalers, once without) to two bus
// endpoints consuming that type. Each endpoint runs its consumer once per
// message id; the copies published again are absorbed by the inbox.
func TestWatermillNativePublisherConsumedOnceByEachEndpoint(t *testing.T) {
	url := testenv.AMQPURL(t)
	dsn := testenv.PostgresDSN(t)
	admin, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	adminSQL, err := admin.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adminSQL.Close() })
	_, schemaDSN := testenv.PostgresSchema(t, adminSQL, dsn)
	db, err := postgresdb.Open(schemaDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})

	suffix := fmt.Sprintf("%08x", rand.Uint32())
	topic := "PaymentReceived-" + suffix
	endpoints := []string{"wm-billing-" + suffix, "wm-audit-" + suffix}
	t.Cleanup(func() { deleteTopology(t, url, endpoints, topic) })

	type key struct{ endpoint, id string }
	var mu sync.Mutex
	runs := map[key]int{}
	events := make(chan bus.Event, 64)
	b, err := bus.New(
		bus.WithLogger(slog.New(slog.DiscardHandler)),
		bus.WithDatabase(db),
		bus.WithObserver(func(e bus.Event) {
			if e.Kind == bus.EventHandled {
				events <- e
			}
		}),
		bus.WithTransport(rabbitmq.New(url, func(c *rabbitmq.Config) {
			for _, name := range endpoints {
				c.ReceiveEndpoint(name, func(e *endpoint.Endpoint) {
					endpoint.Consumer(e, func(_ context.Context, c *endpoint.Context[paymentReceived]) error {
						mu.Lock()
						runs[key{name, c.MessageID}]++
						mu.Unlock()
						return nil
					}, endpoint.AsMessageType(topic))
				})
			}
		})),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})

	pub, err := wamqp.NewPublisher(wamqp.NewDurablePubSubConfig(url, nil), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	body, _ := json.Marshal(paymentReceived{PaymentID: "p-1"})
	plain := message.NewMessage(watermill.NewUUID(), body)
	cqrs := message.NewMessage(watermill.NewUUID(), body)
	cqrs.Metadata.Set("name", topic) // what cqrs.JSONMarshaler sets
	for range 2 {                    // each published twice, as a publisher retrying would
		if err := pub.Publish(topic, plain.Copy(), cqrs.Copy()); err != nil {
			t.Fatal(err)
		}
	}

	outcomes := map[string]int{}
	deadline := time.After(20 * time.Second)
	for n := 0; n < 2*2*len(endpoints); n++ {
		select {
		case e := <-events:
			outcomes[e.Outcome]++
			if e.Outcome == bus.OutcomeDeadLettered {
				t.Errorf("%s dead-lettered %s: %v", e.Endpoint, e.MessageID, e.Err)
			}
		case <-deadline:
			t.Fatalf("after 20s, outcomes %v; want 4 consumed and 4 duplicates", outcomes)
		}
	}
	if outcomes[bus.OutcomeCommitted] != 4 || outcomes[bus.OutcomeDuplicate] != 4 {
		t.Errorf("outcomes %v; want 4 consumed and 4 duplicates", outcomes)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ep := range endpoints {
		for _, id := range []string{plain.UUID, cqrs.UUID} {
			if n := runs[key{ep, id}]; n != 1 {
				t.Errorf("endpoint %s ran its consumer %d times for %s, want once", ep, n, id)
			}
		}
	}
}

func deleteTopology(t *testing.T, url string, queues []string, exchange string) {
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
		_, _ = ch.QueueDelete(q+"_error", false, false, false)
	}
	_ = ch.ExchangeDelete(exchange, false, false)
}
