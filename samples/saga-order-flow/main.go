// Command saga-order-flow runs BareWire's SagaOrderFlow as a saga: an
// order is submitted (a request: the saga answers OrderAccepted), the saga
// publishes PaymentRequested, schedules a PaymentTimeout back to itself and
// waits in AwaitingPayment; a payment service answers PaymentCompleted (the
// saga publishes OrderDispatched and moves to Shipped) or PaymentFailed, or
// does not answer and the timeout arrives (either way the saga publishes
// OrderCompensated and moves to Compensated). Every transition writes a
// history row in the same transaction as the instance, the inbox mark, the
// outgoing messages and the scheduled timeout (or its cancellation).
//
//	go run ./samples/saga-order-flow -demo     # scripted run, prints and exits
//	go run ./samples/saga-order-flow           # HTTP API on :8080
//
// -transport rabbitmq (with -amqp-url) or -transport postgres (with
// -postgres-dsn) runs it on RabbitMQ or on the PostgreSQL transport; see
// README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/admin"
	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// Messages. The payment service pays amounts up to 1000, declines those up
// to 5000 and never answers above (a provider that hangs).
type (
	OrderSubmitted struct {
		OrderID string  `json:"orderId"`
		Amount  float64 `json:"amount"`
	}
	PaymentRequested struct {
		OrderID string  `json:"orderId"`
		Amount  float64 `json:"amount"`
	}
	PaymentCompleted struct {
		OrderID string `json:"orderId"`
	}
	PaymentFailed struct {
		OrderID string `json:"orderId"`
		Reason  string `json:"reason"`
	}
	OrderDispatched struct {
		OrderID string `json:"orderId"`
	}
	OrderCompensated struct {
		OrderID string `json:"orderId"`
		Reason  string `json:"reason"`
	}
	// PaymentTimeout is the saga's timeout, scheduled back to itself.
	PaymentTimeout struct {
		OrderID string `json:"orderId"`
	}
	// OrderAccepted answers an OrderSubmitted sent as a request.
	OrderAccepted struct {
		OrderID string `json:"orderId"`
		State   string `json:"state"`
	}
)

// snippet:start model
// Order is the saga instance: saga.State plus the order's own data.
type Order struct {
	saga.State
	Amount        float64 `json:"amount"`
	FailureReason string  `json:"failureReason,omitempty"`
	// PaymentTimeoutToken is the id of the pending PaymentTimeout
	// (empty when none is pending).
	PaymentTimeoutToken string `json:"paymentTimeoutToken,omitempty" gorm:"size:64"`
}

// snippet:end model

// History is one transition, written through the consumer's transaction.
type History struct {
	ID      int64     `json:"-" gorm:"primaryKey"`
	OrderID string    `json:"-" gorm:"size:200;index"`
	Event   string    `json:"event"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	At      time.Time `json:"at"`
}

func (History) TableName() string { return "order_flow_history" }

// snippet:start machine
func newMachine(paymentTimeout time.Duration) (*saga.Machine[Order], error) {
	return saga.New("order-flow", func(m *saga.Machine[Order]) {
		awaiting := m.State("AwaitingPayment")
		shipped := m.State("Shipped")
		compensated := m.State("Compensated")

		submitted := saga.NewEvent(m, func(e OrderSubmitted) string { return e.OrderID })
		paid := saga.NewEvent(m, func(e PaymentCompleted) string { return e.OrderID })
		failed := saga.NewEvent(m, func(e PaymentFailed) string { return e.OrderID })
		timedOut := saga.NewEvent(m, func(e PaymentTimeout) string { return e.OrderID })
		// The timeout: its pending message's id is kept in the instance.
		timeout := saga.NewSchedule(m, timedOut, func(o *Order) *string { return &o.PaymentTimeoutToken }, paymentTimeout)

		accepted := func(c *saga.Context[Order, OrderSubmitted]) any {
			return OrderAccepted{OrderID: c.Message.OrderID, State: c.State().CurrentState}
		}
		m.Initially(
			saga.When(submitted).
				Then(func(ctx context.Context, c *saga.Context[Order, OrderSubmitted]) error {
					c.Instance.Amount = c.Message.Amount
					return nil
				}).
				Publish(func(c *saga.Context[Order, OrderSubmitted]) any {
					return PaymentRequested{OrderID: c.Message.OrderID, Amount: c.Message.Amount}
				}).
				Schedule(timeout, func(c *saga.Context[Order, OrderSubmitted]) any {
					return PaymentTimeout{OrderID: c.Message.OrderID}
				}).
				TransitionTo(awaiting).
				Then(record[OrderSubmitted]).
				Respond(accepted),
		)
		// Leaving AwaitingPayment cancels the pending timeout, in the
		// transition's transaction; one that arrives anyway is ignored.
		m.During(awaiting,
			saga.When(paid).
				Publish(func(c *saga.Context[Order, PaymentCompleted]) any {
					return OrderDispatched{OrderID: c.Message.OrderID}
				}).
				TransitionTo(shipped).
				Then(record[PaymentCompleted]),
			saga.When(failed).
				Then(func(ctx context.Context, c *saga.Context[Order, PaymentFailed]) error {
					c.Instance.FailureReason = c.Message.Reason
					return nil
				}).
				Publish(func(c *saga.Context[Order, PaymentFailed]) any {
					return OrderCompensated{OrderID: c.Message.OrderID, Reason: c.Message.Reason}
				}).
				TransitionTo(compensated).
				Then(record[PaymentFailed]),
			saga.When(timedOut).
				Then(func(ctx context.Context, c *saga.Context[Order, PaymentTimeout]) error {
					c.Instance.FailureReason = fmt.Sprintf("no payment within %v", paymentTimeout)
					return nil
				}).
				Publish(func(c *saga.Context[Order, PaymentTimeout]) any {
					return OrderCompensated{OrderID: c.Message.OrderID, Reason: c.Instance.FailureReason}
				}).
				TransitionTo(compensated).
				Then(record[PaymentTimeout]),
		)
		// A repeated submission of an order already under way changes
		// nothing but is answered with the order's state; any other stray
		// event is dead-lettered (the default policy) with the state it met.
		m.DuringAny(saga.When(submitted).Respond(accepted))
	})
}

// record writes the transition to the history table in the transition's
// transaction: it commits with the state change, or neither happens.
func record[M any](ctx context.Context, c *saga.Context[Order, M]) error {
	return c.Tx.Create(&History{
		OrderID: c.State().CorrelationID, Event: endpoint.TypeNameOf[M](),
		From: string(c.From), To: c.State().CurrentState, At: time.Now().UTC(),
	}).Error
}

// snippet:end machine

const sagaEndpoint = "order-flow-saga"

// declare is the endpoint declaration; the same function runs on every
// transport.
func declare(m *saga.Machine[Order]) func(c *endpoint.Endpoints) {
	return func(c *endpoint.Endpoints) {
		// snippet:start register
		c.ReceiveEndpoint(sagaEndpoint, func(e *endpoint.Endpoint) {
			saga.Register(e, m)
		})
		// snippet:end register
		c.ReceiveEndpoint("order-flow-payments", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, pay)
		})
		c.ReceiveEndpoint("order-flow-shipping", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderDispatched]) error {
				return bus.TxFromContext(ctx).Create(&History{OrderID: c.Message.OrderID, Event: "OrderDispatched", From: "shipping", To: "handed to the carrier", At: time.Now().UTC()}).Error
			})
		})
	}
}

// pay is the payment service: it pays amounts up to 1000, declines those
// up to 5000 and does not answer above (the saga's timeout handles it).
func pay(ctx context.Context, c *endpoint.Context[PaymentRequested]) error {
	switch {
	case c.Message.Amount > 5000:
		return nil
	case c.Message.Amount > 1000:
		return c.Publish(ctx, PaymentFailed{OrderID: c.Message.OrderID, Reason: "amount above the 1000 limit"}, nil)
	}
	return c.Publish(ctx, PaymentCompleted{OrderID: c.Message.OrderID}, nil)
}

func main() {
	timeout := flag.Duration("payment-timeout", 30*time.Second, "how long an order waits for its payment before it is compensated (-demo: 2s unless given)")
	f := sample.ParseFlags("127.0.0.1:8080")
	if f.Demo && !flagGiven("payment-timeout") {
		*timeout = 2 * time.Second
	}
	m, err := newMachine(*timeout)
	if err != nil {
		log.Fatal(err)
	}
	b, err := f.NewBus(declare(m), nil)
	if err != nil {
		log.Fatal(err)
	}
	a := &app{b: b, m: m}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.submit)
	mux.HandleFunc("GET /orders/{id}", a.order)
	mux.HandleFunc("GET /orders", a.list)
	// The operators' view: the machine's instances by state (read-only).
	mux.Handle("/admin/", http.StripPrefix("/admin", admin.Handler(b, admin.Sagas(m))))
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, f, *timeout) }, 0, a.migrate); err != nil {
		log.Fatal(err)
	}
}

func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

type app struct {
	b *bus.Bus
	m *saga.Machine[Order]
}

func (a *app) migrate(ctx context.Context) error {
	if err := saga.Migrate(ctx, a.b.DB(), a.m); err != nil {
		return err
	}
	return a.b.DB().WithContext(ctx).AutoMigrate(&History{})
}

// submit starts an order: {"amount": 250} (or ?amount=); the order id is
// new unless the body gives one.
func (a *app) submit(w http.ResponseWriter, r *http.Request) {
	o := OrderSubmitted{Amount: 250}
	if err := sample.ReadJSON(w, r, &o); err != nil {
		sample.WriteError(w, http.StatusBadRequest, err)
		return
	}
	if o.OrderID == "" {
		o.OrderID = "order-" + uuid.NewString()[:8]
	}
	if o.Amount <= 0 {
		sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("amount %v: must be positive", o.Amount))
		return
	}
	acc, err := a.submitOrder(r.Context(), o)
	if err != nil {
		sample.WriteError(w, http.StatusServiceUnavailable, err)
		return
	}
	sample.WriteJSON(w, http.StatusAccepted, map[string]any{"orderId": acc.OrderID, "amount": o.Amount, "state": acc.State, "status": "GET /orders/" + o.OrderID})
}

// submitOrder sends o to the saga as a request: the saga's transition
// answers OrderAccepted once it has committed (Respond).
func (a *app) submitOrder(ctx context.Context, o OrderSubmitted) (OrderAccepted, error) {
	return bus.Request[OrderAccepted](ctx, a.b, sagaEndpoint, o, bus.WithRequestTimeout(10*time.Second))
}

type orderView struct {
	*Order
	History []History `json:"history"`
}

func (a *app) view(ctx context.Context, id string) (*orderView, error) {
	o, err := a.m.Get(ctx, a.b.DB(), id)
	if err != nil {
		return nil, err
	}
	v := &orderView{Order: o}
	err = a.b.DB().WithContext(ctx).Where("order_id = ?", id).Order("id").Find(&v.History).Error
	return v, err
}

// order shows an order's state and history.
func (a *app) order(w http.ResponseWriter, r *http.Request) {
	v, err := a.view(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, saga.ErrNotFound):
		sample.WriteError(w, http.StatusNotFound, err)
	case err != nil:
		sample.WriteError(w, http.StatusInternalServerError, err)
	default:
		sample.WriteJSON(w, http.StatusOK, v)
	}
}

// list shows up to 100 orders, ?state= to keep one state.
func (a *app) list(w http.ResponseWriter, r *http.Request) {
	os, err := a.m.List(r.Context(), a.b.DB(), saga.StateName(r.URL.Query().Get("state")), 100)
	if err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	sample.WriteJSON(w, http.StatusOK, map[string]any{"count": len(os), "orders": os})
}

// demo submits an order the payment service pays, one it declines and one
// it never answers (the saga's timeout compensates it), submits the first
// again, and checks where all three ended.
func (a *app) demo(ctx context.Context, f sample.Flags, timeout time.Duration) error {
	if err := a.migrate(ctx); err != nil {
		return err
	}
	fmt.Printf("saga-order-flow on %s (payment timeout %v)\n", f.Transport(), timeout)
	run := sample.RunID()
	good := OrderSubmitted{OrderID: "order-" + run + "-1", Amount: 250}
	bad := OrderSubmitted{OrderID: "order-" + run + "-2", Amount: 2000}
	hung := OrderSubmitted{OrderID: "order-" + run + "-3", Amount: 9000}
	var answers []OrderAccepted
	for _, o := range []OrderSubmitted{good, bad, hung} {
		acc, err := a.submitOrder(ctx, o)
		if err != nil {
			return err
		}
		answers = append(answers, acc)
		fmt.Printf("  submitted %s (amount %v): the saga answered %s\n", o.OrderID, o.Amount, acc.State)
	}
	wait := func(id, state string, rows int) (*orderView, error) {
		var v *orderView
		err := sample.WaitUntil(ctx, id+" in "+state, func() (bool, error) {
			var err error
			v, err = a.view(ctx, id)
			if errors.Is(err, saga.ErrNotFound) {
				return false, nil
			}
			return err == nil && v.CurrentState == state && len(v.History) >= rows, err
		})
		return v, err
	}
	gv, err := wait(good.OrderID, "Shipped", 3)
	if err != nil {
		return err
	}
	bv, err := wait(bad.OrderID, "Compensated", 2)
	if err != nil {
		return err
	}
	hv, err := wait(hung.OrderID, "Compensated", 2)
	if err != nil {
		return err
	}
	// The same submission again, with a new message id: the saga answers
	// with the order's state and the order does not move.
	again, err := a.submitOrder(ctx, good)
	if err != nil {
		return err
	}
	gv2, err := a.view(ctx, good.OrderID)
	if err != nil {
		return err
	}
	for _, v := range []*orderView{gv, bv, hv} {
		fmt.Printf("  %s: %s %s\n", v.CorrelationID, v.CurrentState, v.FailureReason)
		for _, h := range v.History {
			fmt.Printf("      %-16s %s -> %s\n", h.Event, h.From, h.To)
		}
	}
	var c sample.Checks
	for i, acc := range answers {
		c.Expect(acc.State == "AwaitingPayment", "order %d answered AwaitingPayment (%s)", i+1, acc.State)
	}
	c.Expect(gv.CurrentState == "Shipped" && gv.PaymentTimeoutToken == "", "order 1 paid and shipped; its payment timeout cancelled")
	c.Expect(bv.CurrentState == "Compensated" && bv.FailureReason == "amount above the 1000 limit", "order 2 declined and compensated (%s)", bv.FailureReason)
	c.Expect(hv.CurrentState == "Compensated" && hv.History[len(hv.History)-1].Event == "PaymentTimeout", "order 3 unanswered, compensated by its payment timeout (%s)", hv.FailureReason)
	c.Expect(again.State == "Shipped", "a repeated submission is answered with the order's state (%s)", again.State)
	c.Expect(gv2.CurrentState == gv.CurrentState && len(gv2.History) == len(gv.History), "a repeated submission changed nothing")
	return c.Err()
}
