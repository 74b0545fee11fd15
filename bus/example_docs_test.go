package bus_test

// The examples in this file are the source of the code blocks in docs/.
// Those with an "// Output:" comment run on the embedded default with
// `go test`; the others need a broker and a database and only compile.
// Edit them here, then run `go run ./internal/tools/docsnippets -fix`.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// ---------------------------------------------------------------------------
// Helpers (not shown in the docs).

// startDoc builds and starts a bus for an example, with logs discarded.
func startDoc(ctx context.Context, opts ...bus.Option) *bus.Bus {
	b, err := bus.New(append([]bus.Option{bus.WithLogger(discardLogger())}, opts...)...)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return b
}

// eventually polls cond for up to 10s.
func eventually(cond func() bool) {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			log.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Getting started.

// snippet:start hello
// Greeting is a message. Its type name on the wire (the BW-MessageType
// header) is its Go type name, "Greeting".
type Greeting struct {
	Name string `json:"name"`
}

// runHello runs a bus on the embedded default (the in-process transport
// and in-memory SQLite), publishes one Greeting and waits for the consumer.
func runHello(ctx context.Context) error {
	handled := make(chan struct{}, 1)
	b, err := bus.New(
		// The transport, and in its block the receive endpoints.
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("greeter", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[Greeting]) error {
					fmt.Printf("Hello, %s (message-id %s)\n", c.Message.Name, c.MessageID)
					handled <- struct{}{}
					return nil
				})
			})
		})),
	)
	if err != nil {
		return err // every configuration mistake, joined
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer b.Stop(context.WithoutCancel(ctx))

	err = b.Publish(ctx, Greeting{Name: "Gopher"}, bus.Headers{bus.HeaderMessageID: "hello-1"})
	if err != nil {
		return err
	}
	select {
	case <-handled:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// snippet:end hello

// Example_hello is the five-minute program of docs/getting-started.md.
func Example_hello() {
	// snippet:start hello-main
	if err := runHello(context.Background()); err != nil {
		log.Fatal(err)
	}
	// snippet:end hello-main

	// Output: Hello, Gopher (message-id hello-1)
}

// snippet:start service
// OrderAccepted is the event the HTTP API publishes.
type OrderAccepted struct {
	OrderID  string `json:"orderId"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// OrderRecord is the service's own table.
type OrderRecord struct {
	ID       string `json:"id" gorm:"primaryKey"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
	Status   string `json:"status"` // placed, then reserved
}

// declareOrderEndpoints declares the receive endpoints, in the block of
// whichever transport the service runs on: the same function serves the
// in-process transport and RabbitMQ.
func declareOrderEndpoints(c *endpoint.Endpoints) {
	c.ReceiveEndpoint("order-fulfilment", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, reserveStock)
	})
}

// reserveStock runs once per OrderAccepted message: its write commits in
// the same transaction as the inbox's processed mark.
func reserveStock(ctx context.Context, c *endpoint.Context[OrderAccepted]) error {
	return bus.TxFromContext(ctx).Model(&OrderRecord{}).
		Where("id = ?", c.Message.OrderID).
		Update("status", "reserved").Error
}

// startOrderService starts a bus with the given options (the transport,
// whose block calls declareOrderEndpoints, and the database), creates the
// service's table and returns the HTTP API.
func startOrderService(ctx context.Context, opts ...bus.Option) (*bus.Bus, http.Handler, error) {
	b, err := bus.New(opts...)
	if err != nil {
		return nil, nil, err
	}
	if err := b.Start(ctx); err != nil {
		return nil, nil, err
	}
	if err := b.DB().WithContext(ctx).AutoMigrate(&OrderRecord{}); err != nil {
		_ = b.Stop(ctx)
		return nil, nil, err
	}
	return b, orderAPI(b), nil
}

// orderAPI serves POST /orders, GET /orders/{id} and the health checks.
func orderAPI(b *bus.Bus) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			SKU      string `json:"sku"`
			Quantity int    `json:"quantity"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.SKU == "" || in.Quantity < 1 {
			http.Error(w, `want {"sku": "...", "quantity": 1 or more}`, http.StatusBadRequest)
			return
		}
		order := OrderRecord{ID: uuid.NewString(), SKU: in.SKU, Quantity: in.Quantity, Status: "placed"}
		err := b.Transaction(r.Context(), func(tx *gorm.DB) error {
			if err := tx.Create(&order).Error; err != nil {
				return err
			}
			// Written to the outbox in tx: sent if and only if tx commits.
			return b.PublishTx(r.Context(), tx,
				OrderAccepted{OrderID: order.ID, SKU: order.SKU, Quantity: order.Quantity},
				bus.Headers{bus.HeaderMessageID: "order-accepted-" + order.ID})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, http.StatusAccepted, order)
	})
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		var order OrderRecord
		err := b.DB().WithContext(r.Context()).First(&order, "id = ?", r.PathValue("id")).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			http.NotFound(w, r)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			writeJSON(w, http.StatusOK, order)
		}
	})
	health := b.HealthHandler() // /health and /health/ready: 503 while unhealthy
	mux.Handle("GET /health", health)
	mux.Handle("GET /health/live", health)
	mux.Handle("GET /health/ready", health)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// snippet:end service

// Example_orderService runs the order service of docs/getting-started.md on
// the embedded default, through its HTTP API.
func Example_orderService() {
	ctx := context.Background()
	b, api, err := startOrderService(ctx,
		bus.WithTransport(inproc.New(func(c *inproc.Config) { declareOrderEndpoints(&c.Endpoints) })),
		bus.WithLogger(discardLogger()))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)

	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest("POST", "/orders", strings.NewReader(`{"sku":"BOOK-1","quantity":2}`)))
	var order OrderRecord
	_ = json.Unmarshal(rec.Body.Bytes(), &order)
	fmt.Println("POST /orders:", rec.Code, order.Status)

	eventually(func() bool {
		rec = httptest.NewRecorder()
		api.ServeHTTP(rec, httptest.NewRequest("GET", "/orders/"+order.ID, nil))
		_ = json.Unmarshal(rec.Body.Bytes(), &order)
		return order.Status == "reserved"
	})
	fmt.Println("GET /orders/{id}:", rec.Code, order.Status)
	// Output:
	// POST /orders: 202 placed
	// GET /orders/{id}: 200 reserved
}

// Example_orderServiceOnRabbitMQ is the same service on RabbitMQ and
// PostgreSQL. It compiles but does not run under go test.
func Example_orderServiceOnRabbitMQ() {
	// snippet:start service-main
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, err := postgresdb.Open(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	b, api, err := startOrderService(ctx,
		bus.WithTransport(rabbitmq.New(os.Getenv("AMQP_URL"), func(c *rabbitmq.Config) {
			declareOrderEndpoints(&c.Endpoints)
		})),
		bus.WithDatabase(db), // inbox and outbox tables in PostgreSQL
	)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: api, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("listening on http://%s", srv.Addr)
	select {
	case <-ctx.Done(): // SIGINT or SIGTERM
	case err := <-errc:
		log.Print(err) // could not listen
	}
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx) // stop taking requests first, then drain in-flight messages and the outbox
	if err := b.Stop(sctx); err != nil {
		log.Print(err)
	}
	// snippet:end service-main
}

// ---------------------------------------------------------------------------
// Configuration.

// Example_configuration shows every bus option. It compiles but does not
// run under go test.
func Example_configuration() {
	var db *gorm.DB // postgresdb.Open(dsn), or any *gorm.DB on PostgreSQL or SQLite
	var logger *slog.Logger
	amqpURL := "amqp://app:secret@127.0.0.1:5672/app"
	// snippet:start config-bus
	b, err := bus.New(
		// The transport, and in its block its settings and the receive
		// endpoints: RabbitMQ here; pgtransport.New and inproc.New alike.
		// Without it, the in-process transport with no endpoints.
		bus.WithTransport(rabbitmq.New(amqpURL, func(c *rabbitmq.Config) {
			c.PublishTimeout = 10 * time.Second
			c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) { /* ... */ })
			c.ReceiveEndpoint("audit", func(e *endpoint.Endpoint) { /* ... */ })
		})),
		// Database for the inbox and outbox tables. Without it, the
		// transport's (pgtransport) or an embedded SQLite database...
		bus.WithDatabase(db),
		// bus.WithSQLite("barewire.db"), // ...in this file rather than in memory.
		// The inbox and outbox options, on whichever database.
		bus.WithOutbox(func(o *outbox.Options) { o.RelayWorkers = 4 }),
		bus.WithLogger(logger),
		bus.WithSerializer(endpoint.JSON),
		bus.WithInstanceID("billing-7f9c"),
		bus.WithStopTimeout(20*time.Second),
		bus.WithMaxMessageSize(4<<20),
	)
	// snippet:end config-bus
	_, _ = b, err
}

// Example_configurationErrors shows what New reports for a configuration
// with mistakes: every one of them, joined.
func Example_configurationErrors() {
	// snippet:start config-errors
	_, err := bus.New(
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) {
				e.PrefetchCount = 4
				e.ConcurrentMessageLimit = 8
				e.Retry = endpoint.Interval(3, 0)
			})
		})),
		bus.WithOutbox(func(o *outbox.Options) {
			o.InboxRetention = 10 * time.Second // not more than InboxLockTimeout (30s)
			o.DispatchBatchSize = 50_000
		}),
		bus.WithStopTimeout(-time.Second),
	)
	fmt.Println(errors.Is(err, bus.ErrInvalidOption), errors.Is(err, endpoint.ErrInvalidConfig))
	fmt.Println(err)
	// snippet:end config-errors

	// Output:
	// true true
	// bus: invalid option: WithStopTimeout: -1s must be positive
	// bus: invalid option: outbox options: DispatchBatchSize 50000 must be within 1–10000
	// bus: invalid option: outbox options: InboxRetention 10s must be greater than InboxLockTimeout 30s (otherwise a crashed delivery's lock could be deleted before its redelivery)
	// bus: invalid option: invalid configuration: endpoint "billing": ConcurrentMessageLimit 8 exceeds PrefetchCount 4; raise PrefetchCount so every handler can hold a message
	// bus: invalid option: invalid configuration: endpoint "billing": Retry: retry interval 0s must be positive
	// bus: invalid option: invalid configuration: endpoint "billing": no consumers; register one with endpoint.Consumer[T](e, fn)
}

// Example_rabbitMQConnection shows the RabbitMQ connection settings. It
// compiles but does not run under go test.
func Example_rabbitMQConnection() {
	run := func() error {
		// snippet:start config-rabbitmq
		caPEM, err := os.ReadFile("/etc/barewire/ca.pem")
		if err != nil {
			return err
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caPEM)
		cert, err := tls.LoadX509KeyPair("/etc/barewire/client.pem", "/etc/barewire/client-key.pem")
		if err != nil {
			return err
		}
		b, err := bus.New(bus.WithTransport(rabbitmq.New("amqps://app:secret@rabbit.internal:5671/app", func(c *rabbitmq.Config) {
			c.TLS = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}}
			c.ConnectTimeout = time.Minute           // Start retries a broker that is down this long
			c.ReconnectMaxInterval = 5 * time.Second // cap of the reconnect backoff
			c.MaxPendingPublishes = 2000             // unconfirmed publishes in flight
			c.PublishTimeout = 10 * time.Second      // wait for a publisher confirm
			c.Mandatory = true                       // a publish no queue receives is an error
			c.ReceiveEndpoint("billing", func(e *endpoint.Endpoint) { /* consumers */ })
		})))
		// snippet:end config-rabbitmq
		_ = b
		return err
	}
	_ = run
}

// ---------------------------------------------------------------------------
// Publishing and consuming.

// InvoiceIssued is the message of the publishing examples.
type InvoiceIssued struct {
	InvoiceID string  `json:"invoiceId"`
	Amount    float64 `json:"amount"`
}

func ExampleBus_Publish() {
	ctx := context.Background()
	got := make(chan *endpoint.Context[InvoiceIssued], 1)
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
				got <- c
				return nil
			})
		})
	})))
	defer b.Stop(ctx)

	// snippet:start publish
	err := b.Publish(ctx, InvoiceIssued{InvoiceID: "inv-7", Amount: 120}, bus.Headers{
		bus.HeaderMessageID:     "invoice-inv-7", // kept end to end: the inbox key
		bus.HeaderCorrelationID: "order-42",
		"tenant":                "acme", // any other header travels as it is
	})
	// snippet:end publish
	if err != nil {
		log.Fatal(err)
	}
	c := <-got
	fmt.Println(c.MessageType, c.MessageID, c.CorrelationID, c.Headers["tenant"], c.Message.Amount)
	// Output: InvoiceIssued invoice-inv-7 order-42 acme 120
}

func ExampleBus_PublishTx() {
	ctx := context.Background()
	got := make(chan string, 2)
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
				got <- c.Message.InvoiceID
				return nil
			})
		})
	})))
	defer b.Stop(ctx)

	// snippet:start publish-tx
	// Rolled back: the outbox row goes with it, nothing is ever sent.
	_ = b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := b.PublishTx(ctx, tx, InvoiceIssued{InvoiceID: "inv-rolled-back"}, nil); err != nil {
			return err
		}
		return errors.New("payment declined")
	})

	// Committed: sent at least once, with its message-id.
	err := b.Transaction(ctx, func(tx *gorm.DB) error {
		// ... business writes with tx ...
		return b.PublishTx(ctx, tx, InvoiceIssued{InvoiceID: "inv-8"}, bus.Headers{bus.HeaderMessageID: "invoice-inv-8"})
	})
	// snippet:end publish-tx
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("consumed", <-got)
	// Output: consumed inv-8
}

func ExampleBus_Send() {
	ctx := context.Background()
	got := make(chan string, 3)
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
				got <- c.Message.InvoiceID + " via " + c.Headers["BW-Destination"]
				return nil
			})
		})
	})))
	defer b.Stop(ctx)

	// snippet:start send
	// To one endpoint's queue, by name ("queue:accounting" is the same).
	if err := b.Send(ctx, "accounting", InvoiceIssued{InvoiceID: "inv-9"}, nil); err != nil {
		log.Fatal(err)
	}
	// To an exchange: every queue bound to it.
	if err := b.Send(ctx, "exchange:InvoiceIssued", InvoiceIssued{InvoiceID: "inv-10"}, nil); err != nil {
		log.Fatal(err)
	}
	// snippet:end send
	results := []string{<-got, <-got}
	slices.Sort(results)
	fmt.Println(strings.Join(results, "\n"))
	// Output:
	// inv-10 via exchange:InvoiceIssued
	// inv-9 via queue:accounting
}

func ExampleRaw() {
	ctx := context.Background()
	got := make(chan InvoiceIssued, 1)
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
				got <- c.Message
				return nil
			})
		})
	})))
	defer b.Stop(ctx)

	// snippet:start raw
	body := []byte(`{"invoiceId":"inv-11","amount":99.5}`) // serialized elsewhere
	err := b.Publish(ctx, bus.Raw{Type: "InvoiceIssued", ContentType: "application/json", Body: body}, nil)
	// snippet:end raw
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v\n", <-got)
	// Output: {InvoiceID:inv-11 Amount:99.5}
}

// InvoicePaid is a follow-up message of the examples.
type InvoicePaid struct {
	InvoiceID string `json:"invoiceId"`
}

func ExampleTxFromContext() {
	ctx := context.Background()
	paid := make(chan *endpoint.Context[InvoicePaid], 1)
	// snippet:start consume-and-publish
	type Payment struct {
		InvoiceID string `gorm:"primaryKey"`
		Amount    float64
	}
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("payments", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
				tx := bus.TxFromContext(ctx) // the consumer's transaction
				if err := tx.Create(&Payment{InvoiceID: c.Message.InvoiceID, Amount: c.Message.Amount}).Error; err != nil {
					return err
				}
				// Written to the outbox in the same transaction; carries
				// this message's correlation id unless the headers set one.
				return c.Publish(ctx, InvoicePaid{InvoiceID: c.Message.InvoiceID}, nil)
			})
		})
		c.ReceiveEndpoint("receipts", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoicePaid]) error {
				paid <- c
				return nil
			})
		})
	})))
	// snippet:end consume-and-publish
	defer b.Stop(ctx)
	if err := b.DB().AutoMigrate(&Payment{}); err != nil {
		log.Fatal(err)
	}
	err := b.Publish(ctx, InvoiceIssued{InvoiceID: "inv-12", Amount: 10}, bus.Headers{bus.HeaderCorrelationID: "order-77"})
	if err != nil {
		log.Fatal(err)
	}
	c := <-paid
	fmt.Println(c.Message.InvoiceID, c.CorrelationID)
	// Output: inv-12 order-77
}

// snippet:start serializer
// xmlSerializer writes and reads bodies as XML.
type xmlSerializer struct{}

func (xmlSerializer) ContentType() string                { return "application/xml" }
func (xmlSerializer) Marshal(v any) ([]byte, error)      { return xml.Marshal(v) }
func (xmlSerializer) Unmarshal(data []byte, v any) error { return xml.Unmarshal(data, v) }

// snippet:end serializer

func ExampleWithSerializer() {
	ctx := context.Background()
	got := make(chan *endpoint.Context[InvoiceIssued], 1)
	// snippet:start serializer-use
	b := startDoc(ctx,
		bus.WithSerializer(xmlSerializer{}), // how this bus writes bodies
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
				e.Serializer = xmlSerializer{} // how this endpoint reads them
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
					got <- c
					return nil
				})
			})
		})),
	)
	// snippet:end serializer-use
	defer b.Stop(ctx)
	if err := b.Publish(ctx, InvoiceIssued{InvoiceID: "inv-13", Amount: 5}, nil); err != nil {
		log.Fatal(err)
	}
	c := <-got
	fmt.Println(c.ContentType, string(c.Body))
	// Output: application/xml <InvoiceIssued><InvoiceID>inv-13</InvoiceID><Amount>5</Amount></InvoiceIssued>
}

// ---------------------------------------------------------------------------
// Inbox.

func ExampleBus_InboxStore() {
	ctx := context.Background()
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error { return nil })
		})
	})))
	defer b.Stop(ctx)
	for range 3 { // a producer retrying with the same message-id
		if err := b.Publish(ctx, InvoiceIssued{InvoiceID: "inv-14"}, bus.Headers{bus.HeaderMessageID: "invoice-inv-14"}); err != nil {
			log.Fatal(err)
		}
	}
	eventually(func() bool { s := b.Stats(); return s.Consumed+s.Duplicates == 3 })

	// snippet:start inbox-inspect
	st := b.Stats()
	fmt.Printf("consumed %d, duplicates skipped %d\n", st.Consumed, st.Duplicates)

	entries, err := b.InboxStore().List(ctx, inbox.Query{MessageID: "invoice-inv-14"})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range entries {
		fmt.Println(e.MessageID, e.ConsumerType, "processed:", e.ProcessedAt != nil, "attempts:", e.Attempts)
	}
	counts, err := b.InboxStore().Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%+v\n", counts)
	// snippet:end inbox-inspect

	// Output:
	// consumed 1, duplicates skipped 2
	// invoice-inv-14 accounting processed: true attempts: 1
	// {Locked:0 Expired:0}
}

// ---------------------------------------------------------------------------
// Outbox.

func ExampleBus_OutboxStore() {
	ctx := context.Background()
	// snippet:start outbox-park
	b := startDoc(ctx,
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error { return nil })
			})
		})),
		bus.WithOutbox(func(o *outbox.Options) { o.MaxAttempts = 1 }),
	)
	defer b.Stop(ctx)

	// A send to a queue that does not exist fails at the relay, not here.
	err := b.Transaction(ctx, func(tx *gorm.DB) error {
		return b.SendTx(ctx, tx, "queue:no-such-queue", InvoiceIssued{InvoiceID: "inv-15"}, nil)
	})
	if err != nil {
		log.Fatal(err)
	}
	eventually(func() bool { s, _ := b.OutboxStore().Stats(ctx); return s.Parked == 1 })

	parked, err := b.OutboxStore().List(ctx, outbox.Query{Status: outbox.StatusParked})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range parked {
		fmt.Println(m.Destination, m.Attempts, m.LastError)
	}
	// After fixing the cause: back to pending, attempts reset.
	n, err := b.OutboxStore().Requeue(ctx, []int64{parked[0].ID})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("requeued", n)
	// snippet:end outbox-park

	// Output:
	// queue:no-such-queue 1 inproc: no such queue "no-such-queue" (declare an endpoint with that name)
	// requeued 1
}

func Example_outboxMigrationFiles() {
	migrationsDir, err := os.MkdirTemp("", "migrations")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(migrationsDir)
	// snippet:start migration-files
	// The bus's migration files, with the default prefix barewire_, go into
	// your migrations folder under your own numbering; goose, Atlas and
	// plain-SQL tools all run them as they are. Then start the bus with
	// outbox.Options.DisableAutoMigrate set.
	files, err := gormstore.Migrations(gormstore.DialectPostgres)
	if err != nil {
		log.Fatal(err)
	}
	names, err := fs.Glob(files, "*.sql") // 001_init.sql, 002_ordering_key.sql, ...
	if err != nil {
		log.Fatal(err)
	}
	for i, name := range names {
		sql, err := fs.ReadFile(files, name)
		if err != nil {
			log.Fatal(err)
		}
		ours := fmt.Sprintf("2025060112%04d_barewire_%s", i, name[4:]) // your numbering
		if err := os.WriteFile(filepath.Join(migrationsDir, ours), sql, 0o644); err != nil {
			log.Fatal(err)
		}
	}
	// snippet:end migration-files
	initSQL, err := fs.ReadFile(files, names[0])
	if err != nil {
		log.Fatal(err)
	}
	for line := range strings.Lines(string(initSQL)) {
		if strings.HasPrefix(line, "-- +goose") || strings.HasPrefix(line, "CREATE TABLE") {
			fmt.Print(line)
		}
	}
	// Output:
	// -- +goose Up
	// CREATE TABLE IF NOT EXISTS barewire_inbox (
	// CREATE TABLE IF NOT EXISTS barewire_outbox (
}

func Example_outboxMigrationSQL() {
	// snippet:start migration-sql
	// Another table prefix: the same statements, as one script (a goose
	// migration too) for your tool.
	script, err := gormstore.MigrationSQL(gormstore.DialectPostgres, "billing_")
	if err != nil {
		log.Fatal(err)
	}
	// snippet:end migration-sql
	for line := range strings.Lines(script) {
		if strings.HasPrefix(line, "-- +goose") || strings.HasPrefix(line, "CREATE TABLE") {
			fmt.Print(line)
		}
	}
	// Output:
	// -- +goose Up
	// CREATE TABLE IF NOT EXISTS billing_inbox (
	// CREATE TABLE IF NOT EXISTS billing_outbox (
}

// ---------------------------------------------------------------------------
// Retries and dead letters.

func Example_errorQueue() {
	ctx := context.Background()
	dead := make(chan *endpoint.Delivery, 1)
	// snippet:start error-queue
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(2) // 3 attempts in all
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
				return errors.New("ledger unavailable")
			}, endpoint.Named("ledger"))
		})
		// The error queue is a queue like any other: consume it to alert,
		// store or replay dead letters.
		c.ReceiveEndpoint("accounting_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				dead <- d
				return nil
			})
		})
	})))
	// snippet:end error-queue
	defer b.Stop(ctx)
	if err := b.Publish(ctx, InvoiceIssued{InvoiceID: "inv-16"}, bus.Headers{bus.HeaderMessageID: "invoice-inv-16"}); err != nil {
		log.Fatal(err)
	}
	d := <-dead
	fmt.Println(d.MessageID, d.MessageType, string(d.Body))
	var keys []string
	for k := range d.Headers {
		if strings.HasPrefix(k, "BW-Fault-") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := d.Headers[k]
		if k == "BW-Fault-Time" {
			v = "<RFC 3339 time>"
		}
		fmt.Printf("%s: %s\n", k, v)
	}
	// Output:
	// invoice-inv-16 InvoiceIssued {"invoiceId":"inv-16","amount":0}
	// BW-Fault-Attempts: 3
	// BW-Fault-Endpoint: accounting
	// BW-Fault-Exchange: InvoiceIssued
	// BW-Fault-Reason: consumer ledger: ledger unavailable
	// BW-Fault-Time: <RFC 3339 time>
	// BW-Fault-Type: *errors.errorString
}

func Example_replayDeadLetter() {
	ctx := context.Background()
	var ledgerDown atomic.Bool
	ledgerDown.Store(true)
	booked := make(chan string, 1)
	b := startDoc(ctx, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("accounting", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.NoRetry()
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[InvoiceIssued]) error {
				if ledgerDown.Load() {
					return errors.New("ledger unavailable")
				}
				booked <- c.MessageID
				return nil
			})
		})
		c.ReceiveEndpoint("accounting_error", func(e *endpoint.Endpoint) {
			e.MissingMessageID = endpoint.ProcessMissingID
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				ledgerDown.Store(false) // the cause is fixed (here, at once)
				// snippet:start replay
				// Send the dead letter back to the endpoint that gave up, with
				// its id: it was never marked processed, so the inbox lets it in.
				return d.Send(ctx, d.Headers[bus.HeaderFaultEndpoint],
					bus.Raw{Type: d.MessageType, ContentType: d.ContentType, Body: d.Body},
					bus.Headers{bus.HeaderMessageID: d.MessageID})
				// snippet:end replay
			})
		})
	})))
	defer b.Stop(ctx)
	if err := b.Publish(ctx, InvoiceIssued{InvoiceID: "inv-17"}, bus.Headers{bus.HeaderMessageID: "invoice-inv-17"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("booked", <-booked)
	// Output: booked invoice-inv-17
}
