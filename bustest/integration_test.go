package bustest_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// The harness on RabbitMQ and PostgreSQL: the same waits, the outbox row
// committed with the delivery and relayed through the broker, and no
// goroutine of the bus left behind.
func TestOnRabbitMQAndPostgres(t *testing.T) {
	t.Parallel()
	dsn, url := testenv.PostgresDSN(t), testenv.AMQPURL(t)
	db, err := postgresdb.Open(dsn)
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
		bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }),
		bus.WithTransport(rabbitmq.New(url, func(r *rabbitmq.Config) {
			r.ReceiveEndpoint(billing, func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
					// Sent, not published: the type's exchange is shared with parallel tests.
					return c.Send(ctx, mail, InvoiceIssued{OrderID: c.Message.ID}, nil)
				})
			})
			r.ReceiveEndpoint(mail, func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error { return nil })
			})
		})),
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
	db, err := postgresdb.Open(testenv.PostgresDSN(t))
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
		bus.WithTransport(pgtransport.New(db, func(p *pgtransport.Config) {
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
		})),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }),
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

// DropConnection on RabbitMQ closes the connection while a consumer is
// still handling a message: the bus reconnects, the broker redelivers the
// unacknowledged message, and the inbox skips it as a duplicate.
func TestDropConnectionOnRabbitMQ(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	q := "bustest-drop-" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	t.Cleanup(func() { deleteQueues(t, url, q) })
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := bustest.New(t, bus.WithTransport(rabbitmq.New(url, func(r *rabbitmq.Config) {
		r.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
				once.Do(func() { close(running) })
				<-release
				return nil
			})
		})
	})))
	if err := h.Bus.Send(context.Background(), q, OrderPlaced{ID: "d1"}, nil); err != nil {
		t.Fatal(err)
	}
	<-running
	h.DropConnection()
	close(release)
	bustest.Consumed[OrderPlaced](h, bustest.OnEndpoint(q))
	again := bustest.Consumed[OrderPlaced](h, bustest.OnEndpoint(q), bustest.WithOutcome(bus.OutcomeDuplicate))
	if again.Headers[bus.HeaderRedelivered] != "true" {
		t.Errorf("redelivery headers %v: want %s true", again.Headers, bus.HeaderRedelivered)
	}
	if n := len(h.Seen(q)); n != 1 {
		t.Errorf("consumer ran %d times, want 1", n)
	}
}
