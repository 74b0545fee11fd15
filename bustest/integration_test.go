package bustest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
)

// The harness on RabbitMQ and PostgreSQL: the same waits, the outbox row
// committed with the delivery and relayed through the broker, and no
// goroutine of the bus left behind.
func TestOnRabbitMQAndPostgres(t *testing.T) {
	t.Parallel()
	dsn, url := testenv.PostgresDSN(t), testenv.AMQPURL(t)
	db, err := gormstore.OpenPostgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	prefix, billing, mail := "bt_"+s+"_", "bustest-billing-"+s, "bustest-mail-"+s
	t.Cleanup(func() { // runs after the harness stopped (registered first)
		deleteQueues(t, url, billing, mail)
		for _, tbl := range []string{"inbox", "outbox"} {
			db.Exec(`DROP TABLE IF EXISTS "` + prefix + tbl + `"`)
		}
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	// snippet:start real-services
	h := bustest.New(t,
		bus.WithOutbox(db, func(o *outbox.Options) { o.TablePrefix = prefix }),
		bus.WithRabbitMQ(url, func(r *endpoint.RabbitMQ) {
			r.ReceiveEndpoint(billing, func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
					// Sent, not published: the type's exchange is shared with parallel tests.
					return c.Send(ctx, mail, InvoiceIssued{OrderID: c.Message.ID}, nil)
				})
			})
			r.ReceiveEndpoint(mail, func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error { return nil })
			})
		}),
	)
	if err := h.Bus.Send(context.Background(), billing, OrderPlaced{ID: "r1"}, nil); err != nil {
		t.Fatal(err)
	}
	bustest.Consumed[OrderPlaced](h, bustest.OnEndpoint(billing))
	pub := bustest.Published[InvoiceIssued](h, bustest.Relayed(), bustest.ToDestination(mail))
	got := bustest.Consumed[InvoiceIssued](h, bustest.OnEndpoint(mail))
	// snippet:end real-services
	if got.MessageID != pub.MessageID || got.Message.OrderID != "r1" {
		t.Fatalf("mail consumed %+v, published %+v", got.Record, pub.Record)
	}
	h.WaitIdle()
	if n := len(h.InboxEntries(context.Background())); n != 2 {
		t.Fatalf("%d inbox entries, want 2", n)
	}
}

func deleteQueues(t *testing.T, url string, names ...string) {
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
	for _, q := range names {
		_, _ = ch.QueueDelete(q, false, false, false)
		_, _ = ch.QueueDelete(q+"_error", false, false, false)
	}
}
