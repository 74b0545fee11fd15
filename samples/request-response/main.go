// Command request-response shows bus.Request and Delivery.Respond. POST
// /validate-order sends a ValidateOrder request to the order-validator
// endpoint and waits for its OrderValidation response; the validator
// records each validation in its transaction (GET /validations) and
// answers through the outbox, so the answer leaves only if the record
// commits. An order with the SKU "explode" makes the validator fail: after
// its retries the request is dead-lettered and the caller gets the fault
// (502), not a timeout.
//
//	go run ./samples/request-response -demo    # scripted run, prints and exits
//	go run ./samples/request-response          # HTTP API on 127.0.0.1:8087
//
// Add -amqp-url and -postgres-dsn to run on RabbitMQ and PostgreSQL, or
// -transport postgres with -postgres-dsn to run on the PostgreSQL transport.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// ValidateOrder is the request.
type ValidateOrder struct {
	OrderID string `json:"orderId"`
	Lines   []Line `json:"lines"`
}

// Line is one order line.
type Line struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// OrderValidation is the response.
type OrderValidation struct {
	OrderID  string   `json:"orderId"`
	Valid    bool     `json:"valid"`
	Problems []string `json:"problems,omitempty"`
}

// Validation is the validator's record of one validation, written in the
// consumer's transaction.
type Validation struct {
	RequestID   string    `json:"requestId" gorm:"primaryKey"`
	OrderID     string    `json:"orderId" gorm:"index"`
	Valid       bool      `json:"valid"`
	Problems    string    `json:"problems"`
	ValidatedAt time.Time `json:"validatedAt"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (Validation) TableName() string { return "sample_validations" }

const validatorEndpoint = "order-validator"

// declare is the endpoint declaration, the same on every transport.
func declare(c *endpoint.Endpoints) {
	c.ReceiveEndpoint(validatorEndpoint, func(e *endpoint.Endpoint) {
		e.Retry = endpoint.Immediate(1)
		endpoint.Consumer(e, validate)
	})
}

// snippet:start respond
// validate checks the order, records the verdict and answers, all in the
// consumer's transaction.
func validate(ctx context.Context, c *endpoint.Context[ValidateOrder]) error {
	v := OrderValidation{OrderID: c.Message.OrderID}
	for _, l := range c.Message.Lines {
		if l.SKU == "explode" {
			return fmt.Errorf("validator cannot price SKU %q", l.SKU)
		}
		if l.Quantity <= 0 {
			v.Problems = append(v.Problems, fmt.Sprintf("%s: quantity %d is not positive", l.SKU, l.Quantity))
		}
	}
	if len(c.Message.Lines) == 0 {
		v.Problems = append(v.Problems, "no lines")
	}
	v.Valid = len(v.Problems) == 0
	err := bus.TxFromContext(ctx).Create(&Validation{
		RequestID: c.MessageID, OrderID: v.OrderID, Valid: v.Valid,
		Problems: strings.Join(v.Problems, "; "), ValidatedAt: time.Now().UTC(),
	}).Error
	if err != nil {
		return err
	}
	// Written to the outbox in this transaction: sent only if it commits.
	return c.Respond(ctx, v)
}

// snippet:end respond

func main() {
	f := sample.ParseFlags("127.0.0.1:8087")
	b, err := f.NewBus(declare, nil)
	if err != nil {
		log.Fatal(err)
	}
	a := &app{b: b}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /validate-order", a.postValidate)
	mux.HandleFunc("GET /validations", sample.Rows[Validation](b, "validations", "validated_at DESC", 100, map[string]string{"orderId": "order_id"}))
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, f) }, 0, func(context.Context) error { return a.migrate() }); err != nil {
		log.Fatal(err)
	}
}

type app struct{ b *bus.Bus }

func (a *app) migrate() error { return a.b.DB().AutoMigrate(&Validation{}) }

// snippet:start request
// requestValidation asks the validator and waits at most 5 seconds.
func (a *app) requestValidation(ctx context.Context, order ValidateOrder) (OrderValidation, error) {
	return bus.Request[OrderValidation](ctx, a.b, validatorEndpoint, order,
		bus.WithRequestTimeout(5*time.Second))
}

// snippet:end request

// snippet:start errors
// status maps a Request error to an HTTP status.
func status(err error) int {
	var fault *bus.RequestFaultError
	switch {
	case errors.As(err, &fault):
		return http.StatusBadGateway // the validator failed: fault.Message says why
	case errors.Is(err, bus.ErrRequestTimeout):
		return http.StatusGatewayTimeout // no answer in time
	case errors.Is(err, bus.ErrNoConsumer):
		return http.StatusServiceUnavailable // nobody consumes the destination
	case errors.Is(err, bus.ErrInvalidMessage), errors.Is(err, bus.ErrInvalidOption):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// snippet:end errors

func (a *app) postValidate(w http.ResponseWriter, r *http.Request) {
	var order ValidateOrder
	if err := sample.ReadJSON(w, r, &order); err != nil {
		sample.WriteError(w, http.StatusBadRequest, err)
		return
	}
	if order.OrderID == "" {
		sample.WriteError(w, http.StatusBadRequest, errors.New("orderId is required"))
		return
	}
	v, err := a.requestValidation(r.Context(), order)
	if err != nil {
		sample.WriteError(w, status(err), err)
		return
	}
	sample.WriteJSON(w, http.StatusOK, v)
}

// demo validates a good order, a bad one and one that makes the validator
// fail, and checks the answers and the validator's records.
func (a *app) demo(ctx context.Context, f sample.Flags) error {
	if err := a.migrate(); err != nil {
		return err
	}
	fmt.Printf("request-response on %s\n\n", f.Transport())
	run := sample.RunID()
	good := ValidateOrder{OrderID: "o-" + run + "-1", Lines: []Line{{SKU: "apple", Quantity: 3}}}
	bad := ValidateOrder{OrderID: "o-" + run + "-2", Lines: []Line{{SKU: "pear", Quantity: 0}}}
	boom := ValidateOrder{OrderID: "o-" + run + "-3", Lines: []Line{{SKU: "explode", Quantity: 1}}}

	var c sample.Checks
	begin := time.Now()
	v1, err := a.requestValidation(ctx, good)
	fmt.Printf("POST /validate-order %s → %+v, %v (%v)\n", good.OrderID, v1, err, time.Since(begin).Round(time.Millisecond))
	c.Expect(err == nil && v1.Valid && v1.OrderID == good.OrderID, "good order: valid (got %+v, %v)", v1, err)

	v2, err := a.requestValidation(ctx, bad)
	fmt.Printf("POST /validate-order %s → %+v, %v\n", bad.OrderID, v2, err)
	c.Expect(err == nil && !v2.Valid && len(v2.Problems) == 1, "bad order: invalid with one problem (got %+v, %v)", v2, err)

	begin = time.Now()
	_, err = a.requestValidation(ctx, boom)
	var fault *bus.RequestFaultError
	fmt.Printf("POST /validate-order %s → HTTP %d: %v (%v)\n", boom.OrderID, status(err), err, time.Since(begin).Round(time.Millisecond))
	c.Expect(errors.As(err, &fault) && strings.Contains(fault.Message, `cannot price SKU "explode"`) && fault.Attempts == 2,
		"failing validator: a RequestFaultError after 2 attempts, not a timeout (got %v)", err)

	_, err = bus.Request[OrderValidation](ctx, a.b, "nobody-validates-"+run, good)
	fmt.Printf("request to an unconsumed queue → HTTP %d: %v\n", status(err), err)
	c.Expect(errors.Is(err, bus.ErrNoConsumer), "unconsumed destination: ErrNoConsumer at once (got %v)", err)

	var recs []Validation
	ids := []string{good.OrderID, bad.OrderID, boom.OrderID}
	if err := a.b.DB().WithContext(ctx).Where("order_id IN ?", ids).Order("validated_at").Find(&recs).Error; err != nil {
		return err
	}
	fmt.Printf("\nGET /validations: %d record(s)\n", len(recs))
	for _, r := range recs {
		fmt.Printf("  %s valid=%v %s\n", r.OrderID, r.Valid, r.Problems)
	}
	c.Expect(len(recs) == 2, "two validations recorded; the failed one rolled back (got %d)", len(recs))
	fmt.Println()
	return c.Err()
}
