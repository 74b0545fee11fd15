package bus_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// snippet:start quickstart

type OrderSubmitted struct {
	OrderID string  `json:"orderId"`
	Total   float64 `json:"total"`
}

type Shipment struct {
	OrderID string `gorm:"primaryKey"`
}

// Example shows the shape of a service: endpoints with typed consumers, a
// consumer writing through its transaction, and a transactional publish.
func Example() {
	ctx := context.Background()
	done := make(chan string)
	b, err := bus.New( // the in-process transport, with in-memory SQLite: the embedded default
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderSubmitted]) error {
					// Writes through this transaction commit together with the
					// inbox's processed mark: the effect happens exactly once.
					if err := bus.TxFromContext(ctx).Create(&Shipment{OrderID: c.Message.OrderID}).Error; err != nil {
						return err
					}
					done <- c.Message.OrderID
					return nil
				})
			})
		})),
	)
	if err != nil {
		log.Fatal(err) // every configuration mistake, joined
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)
	if err := b.DB().AutoMigrate(&Shipment{}); err != nil {
		log.Fatal(err)
	}

	// Publish iff the business transaction commits.
	err = b.Transaction(ctx, func(tx *gorm.DB) error {
		// ... business writes with tx ...
		return b.PublishTx(ctx, tx, OrderSubmitted{OrderID: "o-1", Total: 42}, bus.Headers{bus.HeaderMessageID: "order-o-1"})
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("shipped", <-done)
	// Output: shipped o-1
}

// snippet:end quickstart

// Example_rabbitMQ shows the same endpoints on RabbitMQ and PostgreSQL.
// It compiles but does not run here: it needs a broker and a database.
func Example_rabbitMQ() {
	run := func(ctx context.Context, amqpURL string, db *gorm.DB) error {
		// snippet:start rabbitmq
		b, err := bus.New(
			bus.WithTransport(rabbitmq.New(amqpURL, func(c *rabbitmq.Config) {
				c.ReceiveEndpoint("email-notifications", func(e *endpoint.Endpoint) {
					endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderSubmitted]) error {
						return nil // send the e-mail
					})
					e.ConcurrentMessageLimit = 8 // PrefetchCount defaults to it
				})
			})),
			bus.WithDatabase(db), // the inbox and outbox tables, in PostgreSQL
			bus.WithOutbox(func(o *outbox.Options) { o.InboxLockTimeout = 30 * time.Second }),
			bus.WithLogger(slog.New(slog.NewJSONHandler(os.Stderr, nil))),
		)
		if err != nil {
			return err
		}
		return b.Run(ctx) // until ctx is cancelled; then drains and stops
		// snippet:end rabbitmq
	}
	_ = run
}
