// Command multi-consumer shows one receive endpoint, order-events, with
// several consumers dispatched by message type (BW-MessageType):
// OrderCreated, OrderPaid and OrderShipped each have a typed consumer, and a
// RawConsumer catches every other type sent to the queue. OrderPaid has two
// consumers, billing and loyalty-points, told apart with endpoint.Named: they
// run one after the other in ONE transaction under one inbox entry, so when
// loyalty-points fails, billing's write is rolled back with it and the
// message is dead-lettered to order-events_error.
//
//	go run ./samples/multi-consumer -demo   # scripted run, prints and exits
//	go run ./samples/multi-consumer         # HTTP API on 127.0.0.1:8084
//
// Add -amqp-url and -postgres-dsn to run on RabbitMQ and PostgreSQL, or
// -transport postgres with -postgres-dsn to run on the PostgreSQL transport
// (no broker; see README.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// The message types of the order-events endpoint.
type (
	OrderCreated struct {
		OrderID  string `json:"orderId"`
		Customer string `json:"customer"`
	}
	OrderPaid struct {
		OrderID string `json:"orderId"`
		Amount  int64  `json:"amount"` // in cents
		// FailLoyalty makes the loyalty-points consumer fail, to show that
		// billing's write in the same transaction rolls back too.
		FailLoyalty bool `json:"failLoyalty,omitempty"`
	}
	OrderShipped struct {
		OrderID string `json:"orderId"`
		Carrier string `json:"carrier"`
	}
)

const eventsEndpoint = "order-events"

// Handled is one consumer's committed effect for one message.
type Handled struct {
	ID          int64     `json:"-" gorm:"primaryKey"`
	MessageID   string    `json:"messageId" gorm:"index"`
	MessageType string    `json:"messageType"`
	Consumer    string    `json:"consumer"`
	OrderID     string    `json:"orderId" gorm:"index"`
	Detail      string    `json:"detail"`
	HandledAt   time.Time `json:"handledAt"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (Handled) TableName() string { return "sample_handled_events" }

// calls logs every consumer call in memory, committed or not.
type calls struct {
	mu  sync.Mutex
	log map[string][]string // message id → consumer names, in call order
}

func (c *calls) add(messageID, consumer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log[messageID] = append(c.log[messageID], consumer)
}

func (c *calls) of(messageID string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log[messageID])
}

// handle records a consumer's effect in the consumer's transaction.
func (c *calls) handle(ctx context.Context, d *endpoint.Delivery, consumer, orderID, detail string) error {
	c.add(d.MessageID, consumer)
	return bus.TxFromContext(ctx).Create(&Handled{
		MessageID: d.MessageID, MessageType: d.MessageType, Consumer: consumer, OrderID: orderID,
		Detail: detail, HandledAt: time.Now().UTC(),
	}).Error
}

// declare registers the consumers; each closes over the call log.
func (c *calls) declare(eps *endpoint.Endpoints) {
	eps.ReceiveEndpoint(eventsEndpoint, func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, m *endpoint.Context[OrderCreated]) error {
			return c.handle(ctx, m.Delivery, "order-created", m.Message.OrderID, "customer "+m.Message.Customer)
		})
		// snippet:start named
		// Two consumers of one type: each needs a distinct name, and both
		// run, in registration order, in the same transaction.
		endpoint.Consumer(e, func(ctx context.Context, m *endpoint.Context[OrderPaid]) error {
			return c.handle(ctx, m.Delivery, "billing", m.Message.OrderID, "invoice for "+cents(m.Message.Amount))
		}, endpoint.Named("billing"))
		endpoint.Consumer(e, func(ctx context.Context, m *endpoint.Context[OrderPaid]) error {
			if m.Message.FailLoyalty {
				c.add(m.MessageID, "loyalty-points (failed)")
				return endpoint.Permanent(errors.New("loyalty service rejected the order"))
			}
			return c.handle(ctx, m.Delivery, "loyalty-points", m.Message.OrderID, fmt.Sprintf("%d points", m.Message.Amount/100))
		}, endpoint.Named("loyalty-points"))
		// snippet:end named
		endpoint.Consumer(e, func(ctx context.Context, m *endpoint.Context[OrderShipped]) error {
			return c.handle(ctx, m.Delivery, "order-shipped", m.Message.OrderID, "via "+m.Message.Carrier)
		})
		// The catch-all: every type without a typed consumer. (It binds no
		// exchange: such messages reach it when sent to the queue.)
		endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
			var body struct {
				OrderID string `json:"orderId"`
			}
			_ = json.Unmarshal(d.Body, &body) // best effort: the body may be anything
			return c.handle(ctx, d, "catch-all", body.OrderID, fmt.Sprintf("%d bytes of %s", len(d.Body), d.ContentType))
		})
	})
}

func cents(n int64) string { return fmt.Sprintf("%d.%02d", n/100, n%100) }

func main() {
	f := sample.ParseFlags("127.0.0.1:8084")
	c := &calls{log: map[string][]string{}}
	b, err := f.NewBus(c.declare, nil)
	if err != nil {
		log.Fatal(err)
	}
	a := &app{b: b, calls: c}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events", a.postEvent)
	mux.HandleFunc("GET /handled", sample.Rows[Handled](b, "handled", "id DESC", 100, map[string]string{"orderId": "order_id"}))
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, f) }, 0, func(context.Context) error { return a.migrate() }); err != nil {
		log.Fatal(err)
	}
}

type app struct {
	b     *bus.Bus
	calls *calls
}

func (a *app) migrate() error { return a.b.DB().AutoMigrate(&Handled{}) }

var typeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]{0,99}$`)

// event is what POST /events sends.
type event struct {
	Type        string
	OrderID     string
	Amount      int64
	FailLoyalty bool
}

// send publishes the typed events and sends any other type straight to the
// endpoint's queue as a raw JSON message.
func (a *app) send(ctx context.Context, ev event, messageID string) error {
	h := bus.Headers{bus.HeaderMessageID: messageID}
	switch ev.Type {
	case "OrderCreated":
		return a.b.Publish(ctx, OrderCreated{OrderID: ev.OrderID, Customer: "ada"}, h)
	case "OrderPaid":
		return a.b.Publish(ctx, OrderPaid{OrderID: ev.OrderID, Amount: ev.Amount, FailLoyalty: ev.FailLoyalty}, h)
	case "OrderShipped":
		return a.b.Publish(ctx, OrderShipped{OrderID: ev.OrderID, Carrier: "parcel-post"}, h)
	}
	body, err := json.Marshal(map[string]string{"orderId": ev.OrderID})
	if err != nil {
		return err
	}
	return a.b.Send(ctx, eventsEndpoint, bus.Raw{Type: ev.Type, ContentType: "application/json", Body: body}, h)
}

func (a *app) postEvent(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ev := event{Type: q.Get("type"), OrderID: q.Get("orderId"), Amount: 4200}
	if !typeRE.MatchString(ev.Type) {
		sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("type %q: use OrderCreated, OrderPaid, OrderShipped or any other type name (letters, digits, '.', '_', '-')", ev.Type))
		return
	}
	if ev.OrderID == "" {
		ev.OrderID = uuid.NewString()[:8]
	}
	if v := q.Get("amount"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("amount %q: a positive number of cents", v))
			return
		}
		ev.Amount = n
	}
	if v := q.Get("failLoyalty"); v != "" {
		fail, err := strconv.ParseBool(v)
		if err != nil {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("failLoyalty %q: %w", v, err))
			return
		}
		ev.FailLoyalty = fail
	}
	id := uuid.NewString()
	if err := a.send(r.Context(), ev, id); err != nil {
		sample.WriteError(w, http.StatusServiceUnavailable, err)
		return
	}
	sample.WriteJSON(w, http.StatusAccepted, map[string]any{"messageId": id, "type": ev.Type, "orderId": ev.OrderID, "consumers": consumersOf(ev)})
}

// consumersOf says which consumers an event reaches.
func consumersOf(ev event) []string {
	switch ev.Type {
	case "OrderCreated":
		return []string{"order-created"}
	case "OrderPaid":
		if ev.FailLoyalty {
			return []string{"billing", "loyalty-points (fails: both roll back; dead-lettered to " + eventsEndpoint + "_error)"}
		}
		return []string{"billing", "loyalty-points"}
	case "OrderShipped":
		return []string{"order-shipped"}
	}
	return []string{"catch-all"}
}

// demo sends every kind of event and checks who handled what.
func (a *app) demo(ctx context.Context, f sample.Flags) error {
	if err := a.migrate(); err != nil {
		return err
	}
	fmt.Printf("multi-consumer on %s\n\n", f.Transport())
	run := sample.RunID()
	o1, o2 := "o1-"+run, "o2-"+run
	evs := []event{
		{Type: "OrderCreated", OrderID: o1},
		{Type: "OrderPaid", OrderID: o1, Amount: 4200},
		{Type: "OrderShipped", OrderID: o1},
		{Type: "OrderArchived", OrderID: o1},
		{Type: "OrderPaid", OrderID: o2, Amount: 1500, FailLoyalty: true},
	}
	ids := make([]string, len(evs))
	deadBefore := a.b.Stats().DeadLettered
	for i, ev := range evs {
		ids[i] = fmt.Sprintf("ev-%s-%d", run, i+1)
		if err := a.send(ctx, ev, ids[i]); err != nil {
			return err
		}
		note := ""
		if ev.FailLoyalty {
			note = " failLoyalty=true"
		}
		fmt.Printf("sent %-13s order %-11s%s → %v\n", ev.Type, ev.OrderID, note, consumersOf(ev))
	}
	var hs []Handled
	err := sample.WaitUntil(ctx, "every event to be handled", func() (bool, error) {
		hs = nil
		if err := a.b.DB().WithContext(ctx).Where("message_id IN ?", ids).Order("id").Find(&hs).Error; err != nil {
			return false, err
		}
		return len(hs) >= 5 && a.b.Stats().DeadLettered > deadBefore, nil
	})
	if err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond) // let a (wrong) extra delivery show up
	hs = nil
	if err := a.b.DB().WithContext(ctx).Where("message_id IN ?", ids).Order("id").Find(&hs).Error; err != nil {
		return err
	}
	fmt.Printf("\ncommitted effects (%s):\n", (Handled{}).TableName())
	got := map[string][]string{} // message id → consumers with a committed row
	for _, h := range hs {
		got[h.MessageID] = append(got[h.MessageID], h.Consumer)
		fmt.Printf("  %-13s %-15s order %-11s %s\n", h.MessageType, h.Consumer, h.OrderID, h.Detail)
	}
	failed := ids[4]
	fmt.Printf("OrderPaid for %s: consumers called %v, committed rows %d; dead-lettered to %s_error\n\n",
		o2, a.calls.of(failed), len(got[failed]), eventsEndpoint)

	var c sample.Checks
	want := [][]string{{"order-created"}, {"billing", "loyalty-points"}, {"order-shipped"}, {"catch-all"}, nil}
	for i, ev := range evs {
		c.Expect(slices.Equal(got[ids[i]], want[i]), "%s for %s: committed by %v (got %v)", ev.Type, ev.OrderID, want[i], got[ids[i]])
	}
	c.Expect(slices.Equal(a.calls.of(failed), []string{"billing", "loyalty-points (failed)"}),
		"the failing OrderPaid ran billing, then loyalty-points, once each (got %v)", a.calls.of(failed))
	c.Expect(a.b.Stats().DeadLettered == deadBefore+1, "exactly one message was dead-lettered")
	return c.Err()
}
