// Command retry-and-dlq shows in-process retries and dead-lettering. The
// orders endpoint retries a failing message 3 times, 100ms apart
// (endpoint.Interval). A transient failure that clears by the 3rd attempt is
// processed; a failure wrapped with endpoint.Permanent, an unknown message
// type, a consumer that always fails and a consumer that panics all end in
// orders_error, the endpoint's error queue, with fault headers saying why
// (BW-Fault-Reason, BW-Fault-Type, BW-Fault-Attempts, BW-Fault-Stack for a
// panic, ...). A second endpoint consumes orders_error with a RawConsumer
// and records each dead letter with its headers.
//
//	go run ./samples/retry-and-dlq -demo   # scripted run, prints and exits
//	go run ./samples/retry-and-dlq         # HTTP API on 127.0.0.1:8083
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// OrderPlaced is the message the orders endpoint consumes. Mode tells the
// consumer how to behave, so that each outcome can be tried.
type OrderPlaced struct {
	OrderID string `json:"orderId"`
	Mode    string `json:"mode"`
	// SucceedOnAttempt is the attempt at which a "transient" order succeeds.
	SucceedOnAttempt int `json:"succeedOnAttempt,omitempty"`
}

// Modes of POST /orders.
const (
	modeOK        = "ok"        // succeeds at once
	modeTransient = "transient" // fails until attempt SucceedOnAttempt, then succeeds
	modePermanent = "permanent" // fails with endpoint.Permanent: no retries
	modeFailing   = "failing"   // always fails: retried, then dead-lettered
	modePanic     = "panic"     // panics on every attempt: retried, then dead-lettered with the stack
	modeUnknown   = "unknown"   // a message type no consumer handles: dead-lettered at once
)

var modes = []string{modeOK, modeTransient, modePermanent, modeFailing, modePanic, modeUnknown}

const (
	ordersEndpoint = "orders"
	errorEndpoint  = ordersEndpoint + "_error" // the orders endpoint's default ErrorQueue
	retries        = 3
	retryInterval  = 100 * time.Millisecond
	// unknownType is the message type of mode=unknown.
	unknownType = "OrderAmended"
)

// ProcessedOrder is written by the orders consumer, in its transaction, when
// an order succeeds.
type ProcessedOrder struct {
	OrderID     string    `json:"orderId" gorm:"primaryKey"`
	MessageID   string    `json:"messageId"`
	Mode        string    `json:"mode"`
	Attempt     int       `json:"attempt"`
	ProcessedAt time.Time `json:"processedAt"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (ProcessedOrder) TableName() string { return "sample_processed_orders" }

// DeadLetter is a message received from orders_error, with its fault headers.
type DeadLetter struct {
	ID          int64             `json:"-" gorm:"primaryKey"`
	MessageID   string            `json:"messageId" gorm:"index"`
	MessageType string            `json:"messageType"`
	Reason      string            `json:"reason"`
	FaultType   string            `json:"faultType"`
	Attempts    int               `json:"attempts"`
	Endpoint    string            `json:"endpoint"`
	Stack       string            `json:"-"`
	Headers     map[string]string `json:"headers" gorm:"serializer:json;type:text"`
	Body        string            `json:"body"`
	ReceivedAt  time.Time         `json:"receivedAt"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (DeadLetter) TableName() string { return "sample_dead_letters" }

// attempt is one call of the orders consumer.
type attempt struct {
	Attempt int       `json:"attempt"`
	Error   string    `json:"error,omitempty"`
	At      time.Time `json:"at"`
}

// processor is the orders consumer. It logs every attempt in memory (failed
// attempts roll back their transaction, so the log cannot live there).
type processor struct {
	mu       sync.Mutex
	attempts map[string][]attempt // by message id
}

func (p *processor) record(messageID string, n int, err error) {
	a := attempt{Attempt: n, At: time.Now().UTC()}
	if err != nil {
		a.Error = err.Error()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts[messageID] = append(p.attempts[messageID], a)
}

func (p *processor) log() map[string][]attempt {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]attempt, len(p.attempts))
	for k, v := range p.attempts {
		out[k] = slices.Clone(v)
	}
	return out
}

// Consume implements endpoint.Handler[OrderPlaced].
func (p *processor) Consume(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
	m := c.Message
	var err error
	switch m.Mode {
	case modeOK:
	case modeTransient:
		if c.Attempt < m.SucceedOnAttempt {
			err = fmt.Errorf("inventory service unavailable (attempt %d; succeeds on attempt %d)", c.Attempt, m.SucceedOnAttempt)
		}
	case modePermanent:
		err = endpoint.Permanent(fmt.Errorf("order %s rejected: SKU does not exist", m.OrderID))
	case modeFailing:
		err = errors.New("payment gateway timed out")
	case modePanic:
		p.record(c.MessageID, c.Attempt, errors.New("panic"))
		panic(fmt.Sprintf("order %s: price list not loaded", m.OrderID)) // a bug: panics on every attempt
	default:
		err = endpoint.Permanent(fmt.Errorf("unknown mode %q", m.Mode))
	}
	p.record(c.MessageID, c.Attempt, err)
	if err != nil {
		return err
	}
	return bus.TxFromContext(ctx).Create(&ProcessedOrder{
		OrderID: m.OrderID, MessageID: c.MessageID, Mode: m.Mode, Attempt: c.Attempt, ProcessedAt: time.Now().UTC(),
	}).Error
}

// recordDeadLetter is the orders_error consumer: it sees every dead letter
// as bytes and headers, whatever its type.
func recordDeadLetter(ctx context.Context, d *endpoint.Delivery) error {
	h := d.Headers
	n, _ := strconv.Atoi(h[bus.HeaderFaultAttempts]) // absent or malformed: 0
	headers := make(map[string]string, len(h))
	for k, v := range h {
		if k != bus.HeaderFaultStack {
			headers[k] = v
		}
	}
	return bus.TxFromContext(ctx).Create(&DeadLetter{
		MessageID: d.MessageID, MessageType: d.MessageType,
		Reason: h[bus.HeaderFaultReason], FaultType: h[bus.HeaderFaultType], Attempts: n,
		Endpoint: h[bus.HeaderFaultEndpoint], Stack: h[bus.HeaderFaultStack], Headers: headers,
		Body: string(d.Body), ReceivedAt: time.Now().UTC(),
	}).Error
}

func main() {
	f := sample.ParseFlags("127.0.0.1:8083")
	p := &processor{attempts: map[string][]attempt{}}
	declare := func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(ordersEndpoint, func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Interval(retries, retryInterval)
			endpoint.ConsumerOf[OrderPlaced](e, p)
		})
		c.ReceiveEndpoint(errorEndpoint, func(e *endpoint.Endpoint) {
			// Dead letters keep their message id, but a message rejected
			// for having none has none: record it anyway.
			e.MissingMessageID = endpoint.ProcessMissingID
			e.Retry = endpoint.NoRetry()
			endpoint.RawConsumer(e, recordDeadLetter)
		})
	}
	b, err := f.NewBus(declare, nil)
	if err != nil {
		log.Fatal(err)
	}
	a := &app{b: b, p: p}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.postOrder)
	mux.HandleFunc("GET /processed", sample.Rows[ProcessedOrder](b, "processed", "processed_at DESC", 100, nil))
	mux.HandleFunc("GET /dead-letters", a.deadLetters)
	mux.HandleFunc("GET /attempts", func(w http.ResponseWriter, r *http.Request) { sample.WriteJSON(w, http.StatusOK, p.log()) })
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, f) }, 0, func(context.Context) error { return a.migrate() }); err != nil {
		log.Fatal(err)
	}
}

type app struct {
	b *bus.Bus
	p *processor
}

func (a *app) migrate() error { return a.b.DB().AutoMigrate(&ProcessedOrder{}, &DeadLetter{}) }

// expectations says what each mode leads to.
var expectations = map[string]string{
	modeOK:        "processed on attempt 1",
	modeTransient: "fails until attempt succeedOnAttempt, then processed (dead-lettered if that is past attempt 4)",
	modePermanent: "dead-lettered after 1 attempt (endpoint.Permanent skips retries)",
	modeFailing:   "dead-lettered after 4 attempts (1 + 3 retries)",
	modePanic:     "dead-lettered after 4 attempts, with the stack in BW-Fault-Stack",
	modeUnknown:   "dead-lettered after 1 attempt: no consumer for message type " + unknownType,
}

// place sends one order in the given mode.
func (a *app) place(ctx context.Context, orderID, mode string, succeedOn int) (string, error) {
	id := "order-" + orderID
	h := bus.Headers{bus.HeaderMessageID: id}
	if mode == modeUnknown {
		body, err := json.Marshal(map[string]string{"orderId": orderID})
		if err != nil {
			return "", err
		}
		return id, a.b.Send(ctx, ordersEndpoint, bus.Raw{Type: unknownType, ContentType: "application/json", Body: body}, h)
	}
	return id, a.b.Publish(ctx, OrderPlaced{OrderID: orderID, Mode: mode, SucceedOnAttempt: succeedOn}, h)
}

func (a *app) postOrder(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode := q.Get("mode")
	if mode == "" {
		mode = modeOK
	}
	if !slices.Contains(modes, mode) {
		sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("mode %q: use one of %s", mode, strings.Join(modes, ", ")))
		return
	}
	succeedOn := 3
	if v := q.Get("succeedOn"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("succeedOn %q: a positive attempt number", v))
			return
		}
		succeedOn = n
	}
	orderID := q.Get("orderId")
	if orderID == "" {
		orderID = uuid.NewString()[:8]
	}
	id, err := a.place(r.Context(), orderID, mode, succeedOn)
	if err != nil {
		sample.WriteError(w, http.StatusServiceUnavailable, err)
		return
	}
	resp := map[string]any{"orderId": orderID, "messageId": id, "mode": mode, "expect": expectations[mode]}
	if mode == modeTransient {
		resp["succeedOnAttempt"] = succeedOn
	}
	sample.WriteJSON(w, http.StatusAccepted, resp)
}

// deadLetterView adds the first lines of the stack to a dead letter.
type deadLetterView struct {
	DeadLetter
	Stack []string `json:"stack,omitempty"`
}

func view(d DeadLetter) deadLetterView {
	v := deadLetterView{DeadLetter: d}
	if d.Stack != "" {
		lines := strings.Split(strings.TrimSpace(d.Stack), "\n")
		if len(lines) > 12 {
			lines = append(lines[:12], fmt.Sprintf("... %d more lines", len(lines)-12))
		}
		v.Stack = lines
	}
	return v
}

func (a *app) deadLetters(w http.ResponseWriter, r *http.Request) {
	var ds []DeadLetter
	if err := a.b.DB().WithContext(r.Context()).Order("id DESC").Limit(100).Find(&ds).Error; err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	out := make([]deadLetterView, 0, len(ds))
	for _, d := range ds {
		out = append(out, view(d))
	}
	sample.WriteJSON(w, http.StatusOK, map[string]any{"count": len(out), "deadLetters": out})
}

// demo places one order in every mode and checks where each ended up.
func (a *app) demo(ctx context.Context, f sample.Flags) error {
	if err := a.migrate(); err != nil {
		return err
	}
	fmt.Printf("retry-and-dlq on %s (orders: %d retries, %v apart)\n\n", f.Transport(), retries, retryInterval)
	run := sample.RunID()
	ids := map[string]string{} // mode → message id
	var all []string
	for _, mode := range modes {
		id, err := a.place(ctx, run+"-"+mode, mode, 3)
		if err != nil {
			return err
		}
		ids[mode] = id
		all = append(all, id)
		fmt.Printf("sent %-10s %-28s expect: %s\n", mode, id, expectations[mode])
	}

	var processed []ProcessedOrder
	var dead []DeadLetter
	err := sample.WaitUntil(ctx, "every order to be processed or dead-lettered", func() (bool, error) {
		processed, dead = nil, nil
		db := a.b.DB().WithContext(ctx)
		if err := db.Where("message_id IN ?", all).Find(&processed).Error; err != nil {
			return false, err
		}
		if err := db.Where("message_id IN ?", all).Find(&dead).Error; err != nil {
			return false, err
		}
		return len(processed)+len(dead) >= len(all), nil
	})
	if err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond) // let a (wrong) extra delivery show up
	byMode := func(id string) string {
		for m, v := range ids {
			if v == id {
				return m
			}
		}
		return "?"
	}
	attempts := a.p.log()
	fmt.Println("\nprocessed:")
	gotProcessed := map[string]ProcessedOrder{}
	for _, p := range processed {
		gotProcessed[byMode(p.MessageID)] = p
		fmt.Printf("  %-10s on attempt %d\n", p.Mode, p.Attempt)
		for _, at := range attempts[p.MessageID] {
			if at.Error != "" {
				fmt.Printf("               attempt %d failed: %s\n", at.Attempt, at.Error)
			}
		}
	}
	fmt.Printf("dead letters received from %s:\n", errorEndpoint)
	gotDead := map[string]DeadLetter{}
	for _, d := range dead {
		mode := byMode(d.MessageID)
		gotDead[mode] = d
		fmt.Printf("  %-10s %s=%d %s=%s\n", mode, bus.HeaderFaultAttempts, d.Attempts, bus.HeaderFaultType, d.FaultType)
		fmt.Printf("             %s=%q\n", bus.HeaderFaultReason, d.Reason)
		if d.Stack != "" {
			fmt.Printf("             %s: %d lines, starting %q\n", bus.HeaderFaultStack, strings.Count(d.Stack, "\n")+1, firstLine(d.Stack))
		}
	}
	st := a.b.Stats()
	fmt.Printf("bus stats: %d consumed, %d retries, %d dead-lettered\n\n", st.Consumed, st.Retries, st.DeadLettered)

	var c sample.Checks
	c.Expect(len(processed) == 2 && len(dead) == 4, "2 orders processed and 4 dead-lettered, each once (got %d and %d)", len(processed), len(dead))
	c.Expect(gotProcessed[modeOK].Attempt == 1, "ok: processed on attempt 1")
	c.Expect(gotProcessed[modeTransient].Attempt == 3, "transient: processed on attempt 3, after 2 failures")
	for mode, n := range map[string]int{modePermanent: 1, modeUnknown: 1, modeFailing: retries + 1, modePanic: retries + 1} {
		d, ok := gotDead[mode]
		c.Expect(ok && d.Attempts == n, "%s: dead-lettered with %s=%d (got %d)", mode, bus.HeaderFaultAttempts, n, d.Attempts)
		c.Expect(ok && d.Reason != "" && d.Endpoint == ordersEndpoint, "%s: %s and %s=%s are set", mode, bus.HeaderFaultReason, bus.HeaderFaultEndpoint, ordersEndpoint)
	}
	c.Expect(strings.Contains(gotDead[modeUnknown].Reason, "no consumer for message type"), "unknown: the reason names the unknown message type")
	c.Expect(gotDead[modePanic].Stack != "", "panic: %s carries the stack", bus.HeaderFaultStack)
	c.Expect(gotDead[modeFailing].Stack == "", "failing: no stack for a plain error")
	return c.Err()
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
