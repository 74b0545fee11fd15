package bus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// TestRabbitUnencodableOutboxRowParkedNeighboursDelivered: an outbox row
// RabbitMQ cannot carry (a 300-byte correlation id written by raw SQL or an
// older version) between good rows. It used to make amqp091 close the
// connection on every relay pass, forever, with nothing behind it
// delivered. Now it is parked at once with its reason, the good rows are
// delivered, and the connection is never lost.
func TestRabbitUnencodableOutboxRowParkedNeighboursDelivered(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	q := env.q("unencodable")
	got := make(chan string, 10)
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(_ context.Context, d *endpoint.Delivery) error {
				got <- d.MessageID
				return nil
			})
		})
	})...)
	ctx := context.Background()
	err := b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := b.SendTx(ctx, tx, q, bus.Raw{Type: "Good", Body: []byte("1")}, bus.Headers{bus.HeaderMessageID: "good-1"}); err != nil {
			return err
		}
		if err := tx.Exec(`INSERT INTO "`+env.prefix+`outbox" (message_id, destination, message_type, correlation_id, headers, payload) VALUES (?, ?, ?, ?, ?, ?)`,
			"bad-1", "queue:"+q, "Good", strings.Repeat("c", 300), "{}", []byte("x")).Error; err != nil {
			return err
		}
		return b.SendTx(ctx, tx, q, bus.Raw{Type: "Good", Body: []byte("2")}, bus.Headers{bus.HeaderMessageID: "good-2"})
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	timeout := time.After(15 * time.Second)
	for !seen["good-1"] || !seen["good-2"] {
		select {
		case id := <-got:
			seen[id] = true
		case <-timeout:
			t.Fatalf("good rows around the bad one not delivered (got %v)", seen)
		}
	}
	if seen["bad-1"] {
		t.Error("the bad row was delivered")
	}
	var parked []*outbox.Message
	waitFor(t, func() bool {
		var err error
		parked, err = b.OutboxStore().List(ctx, outbox.Query{Status: outbox.StatusParked})
		return err == nil && len(parked) == 1
	})
	if parked[0].MessageID != "bad-1" || !strings.Contains(parked[0].LastError, "correlation id is 300 bytes; at most 255") {
		t.Errorf("parked row %s with last error %q; want bad-1 with the reason", parked[0].MessageID, parked[0].LastError)
	}
	if parked[0].Attempts != 1 {
		t.Errorf("parked after %d attempts; want 1 (it can never be sent)", parked[0].Attempts)
	}
	if n := bus.RabbitConnectsForTest(b); n != 1 {
		t.Errorf("the transport connected %d times; want 1 (the bad row must not close the connection)", n)
	}
}
