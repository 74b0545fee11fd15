package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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

// TestRabbitDeadLetterExchangeUnroutableFallsBackToErrorQueue: a dead letter
// to Queue.DeadLetterExchange that no queue is bound to receive used to be
// published non-mandatory, vanish, and the original be acked: the message
// was lost. Now it is returned, and goes to the endpoint's error queue with
// BW-Fault-Unroutable; a routable one still reaches the exchange's queue.
func TestRabbitDeadLetterExchangeUnroutableFallsBackToErrorQueue(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("Doomed")
	dlx := env.typ("dead-letters")
	routed := env.q("dead-routed")
	q := env.q("doomed")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.RetryPolicy{Kind: endpoint.RetryNone}
			e.Queue.DeadLetterExchange = dlx
			e.Queue.DeadLetterRoutingKey = "routed"
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				return endpoint.Permanent(errors.New("doomed"))
			}, endpoint.AsMessageType(typ))
		})
	})...)
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// The exchange exists, but nothing is bound to it yet.
	if err := ch.ExchangeDeclare(dlx, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	get := func(queue string) amqp.Delivery {
		var msg amqp.Delivery
		waitFor(t, func() bool {
			m, ok, err := ch.Get(queue, true)
			if err != nil {
				t.Fatalf("get %s: %v", queue, err)
			}
			msg = m
			return ok
		})
		return msg
	}
	ctx := context.Background()
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "x"}, bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: "doomed-1"}); err != nil {
		t.Fatal(err)
	}
	msg := get(q + "_error")
	if msg.MessageId != "doomed-1" {
		t.Errorf("error queue holds %q; want doomed-1", msg.MessageId)
	}
	if u, _ := msg.Headers[bus.HeaderFaultUnroutable].(string); !strings.Contains(u, dlx) {
		t.Errorf("%s = %q; want it to name the exchange %s", bus.HeaderFaultUnroutable, u, dlx)
	}
	if r, _ := msg.Headers[bus.HeaderFaultReason].(string); !strings.Contains(r, "doomed") {
		t.Errorf("fault reason = %q", r)
	}

	// Once a queue is bound, dead letters go to the exchange as configured.
	if _, err := ch.QueueDeclare(routed, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(routed, "routed", dlx, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, PaymentReceived{PaymentID: "y"}, bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: "doomed-2"}); err != nil {
		t.Fatal(err)
	}
	if msg := get(routed); msg.MessageId != "doomed-2" || msg.Headers[bus.HeaderFaultUnroutable] != nil {
		t.Errorf("routed dead letter %q with headers %v", msg.MessageId, msg.Headers)
	}
}

// TestRabbitHugeErrorTextStillDeadLetters: a consumer error whose text is
// larger than an AMQP frame must not make the dead letter unsendable (and
// so the message requeued forever): the fault reason is truncated.
func TestRabbitHugeErrorTextStillDeadLetters(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("Verbose")
	q := env.q("verbose")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				return endpoint.Permanent(errors.New("verbose: " + strings.Repeat("e", 300_000)))
			}, endpoint.AsMessageType(typ))
		})
	})...)
	if err := b.Publish(context.Background(), PaymentReceived{}, bus.Headers{bus.HeaderMessageType: typ, bus.HeaderMessageID: "verbose-1"}); err != nil {
		t.Fatal(err)
	}
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var msg amqp.Delivery
	waitFor(t, func() bool {
		m, ok, err := ch.Get(q+"_error", true)
		if err != nil {
			t.Fatal(err)
		}
		msg = m
		return ok
	})
	r, _ := msg.Headers[bus.HeaderFaultReason].(string)
	if !strings.HasPrefix(r, "consumer") || !strings.HasSuffix(r, "(truncated)") || len(r) > 4096 {
		t.Errorf("fault reason of %d bytes: %.60q...", len(r), r)
	}
}
