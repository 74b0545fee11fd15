package bustest_test

import (
	"context"
	"errors"
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

// On the PostgreSQL transport a consumer's publish is written to the
// transport's table in its transaction (no outbox row): the harness counts
// it once the delivery committed.
func TestOnPostgresTransport(t *testing.T) {
	t.Parallel()
	db, err := gormstore.OpenPostgres(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	prefix := "bt_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_"
	t.Cleanup(func() { // after the harness stopped
		for _, tbl := range []string{"inbox", "outbox", "queue_messages", "queues", "bindings"} {
			db.Exec(`DROP TABLE IF EXISTS ` + prefix + tbl)
		}
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	h := bustest.New(t,
		bus.WithPostgresTransport(db, func(p *bus.PostgresTransport) {
			p.TablePrefix = prefix
			p.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
				e.Retry = endpoint.Immediate(1)
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
					if err := c.Publish(ctx, InvoiceIssued{OrderID: c.Message.ID}, nil); err != nil {
						return err
					}
					if c.Attempt == 1 { // rolls back what it just wrote
						return errors.New("first attempt fails")
					}
					return nil
				})
			})
			p.ReceiveEndpoint("mail", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error { return nil })
			})
		}),
		bus.WithOutboxOptions(func(o *outbox.Options) { o.TablePrefix = prefix }),
	)
	if err := h.Bus.Publish(context.Background(), OrderPlaced{ID: "p1"}, nil); err != nil {
		t.Fatal(err)
	}
	pub := bustest.Published[InvoiceIssued](h)
	if pub.Outbox || !pub.Committed || pub.ParentEndpoint != "billing" {
		t.Fatalf("publication %+v", pub.Record)
	}
	bustest.Consumed[InvoiceIssued](h, bustest.OnEndpoint("mail"), bustest.WithID(pub.MessageID))
	h.WaitIdle()
	var committed, rolledBack int
	for _, r := range h.Records() {
		if r.Kind == bustest.KindPublished && r.MessageType == "InvoiceIssued" {
			if r.Committed {
				committed++
			}
			if r.RolledBack {
				rolledBack++
			}
		}
	}
	if committed != 1 || rolledBack != 1 {
		t.Fatalf("%d committed, %d rolled back; want 1 and 1\n%s", committed, rolledBack, h.Report())
	}
}
