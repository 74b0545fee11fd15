// Command inbox-deduplication shows the inbox absorbing duplicates: one
// PaymentReceived is fanned out to two endpoints, email-notifications and
// audit-log; re-publishing it with the same message-id, or redelivering it,
// changes nothing — each consumer applied it exactly once.
//
//	go run ./samples/inbox-deduplication -demo     # scripted run, prints and exits
//	go run ./samples/inbox-deduplication           # HTTP API on :8080
//
// -transport rabbitmq (with -amqp-url) or -transport postgres (with
// -postgres-dsn) runs it on RabbitMQ or on the PostgreSQL transport; see
// README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// PaymentReceived is the event both endpoints consume.
type PaymentReceived struct {
	PaymentID string  `json:"paymentId"`
	Amount    float64 `json:"amount"`
}

// Notification is what the email consumer "sent": one row per payment.
type Notification struct {
	MessageID string    `json:"messageId" gorm:"primaryKey"`
	PaymentID string    `json:"paymentId"`
	Amount    float64   `json:"amount"`
	SentAt    time.Time `json:"sentAt"`
}

// AuditEntry is what the audit consumer recorded.
type AuditEntry struct {
	MessageID string    `json:"messageId" gorm:"primaryKey"`
	PaymentID string    `json:"paymentId"`
	At        time.Time `json:"at"`
}

// declare is the endpoint declaration; the same function runs on every
// transport (embedded, RabbitMQ, PostgreSQL).
func declare(c *endpoint.Endpoints) {
	c.ReceiveEndpoint("email-notifications", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, sendEmail)
	})
	c.ReceiveEndpoint("audit-log", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, audit)
	})
}

func sendEmail(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
	// The row commits in the same transaction as the inbox's processed mark.
	return bus.TxFromContext(ctx).Create(&Notification{
		MessageID: c.MessageID, PaymentID: c.Message.PaymentID, Amount: c.Message.Amount, SentAt: time.Now().UTC(),
	}).Error
}

func audit(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
	return bus.TxFromContext(ctx).Create(&AuditEntry{
		MessageID: c.MessageID, PaymentID: c.Message.PaymentID, At: time.Now().UTC(),
	}).Error
}

func main() {
	f := sample.ParseFlags("127.0.0.1:8080")
	var seen deliveries
	b, err := f.NewBus(declare, nil, bus.WithObserver(seen.record))
	if err != nil {
		log.Fatal(err)
	}
	a := &app{b: b}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", a.newPayment)
	mux.HandleFunc("POST /payments/duplicate", a.duplicate)
	mux.HandleFunc("POST /payments/redeliver", a.redeliver)
	mux.HandleFunc("GET /notifications", sample.Rows[Notification](b, "notifications", "sent_at", 0, nil))
	mux.HandleFunc("GET /audit", sample.Rows[AuditEntry](b, "entries", "at", 0, nil))
	mux.HandleFunc("GET /inbox", a.inbox)
	if err := f.Run(b, mux, func(ctx context.Context) error { return demo(ctx, b, f, &seen) }, 0, func(context.Context) error { return migrate(b) }); err != nil {
		log.Fatal(err)
	}
}

func migrate(b *bus.Bus) error { return b.DB().AutoMigrate(&Notification{}, &AuditEntry{}) }

type app struct{ b *bus.Bus }

type published struct {
	MessageID string  `json:"messageId"`
	PaymentID string  `json:"paymentId"`
	Amount    float64 `json:"amount"`
	Action    string  `json:"action"`
}

func (a *app) newPayment(w http.ResponseWriter, r *http.Request) {
	p := PaymentReceived{PaymentID: uuid.NewString(), Amount: 42}
	if v := r.URL.Query().Get("amount"); v != "" {
		amt, err := strconv.ParseFloat(v, 64)
		if err != nil {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("amount: %w", err))
			return
		}
		p.Amount = amt
	}
	id := uuid.NewString()
	if err := a.b.Publish(r.Context(), p, bus.Headers{bus.HeaderMessageID: id}); err != nil {
		sample.WriteError(w, http.StatusServiceUnavailable, err)
		return
	}
	sample.WriteJSON(w, http.StatusAccepted, published{MessageID: id, PaymentID: p.PaymentID, Amount: p.Amount, Action: "published"})
}

// parse reads paymentId, messageId and amount from the query string.
func parse(r *http.Request) (PaymentReceived, string, error) {
	q := r.URL.Query()
	p := PaymentReceived{PaymentID: q.Get("paymentId")}
	id := q.Get("messageId")
	if id == "" || p.PaymentID == "" {
		return p, "", errors.New("paymentId and messageId are required (take them from POST /payments)")
	}
	if v := q.Get("amount"); v != "" {
		amt, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return p, "", fmt.Errorf("amount: %w", err)
		}
		p.Amount = amt
	}
	return p, id, nil
}

// duplicate re-publishes the payment with the same message-id, as a producer
// retrying after a timeout would.
func (a *app) duplicate(w http.ResponseWriter, r *http.Request) {
	p, id, err := parse(r)
	if err != nil {
		sample.WriteError(w, http.StatusBadRequest, err)
		return
	}
	if err := a.b.Publish(r.Context(), p, bus.Headers{bus.HeaderMessageID: id}); err != nil {
		sample.WriteError(w, http.StatusServiceUnavailable, err)
		return
	}
	sample.WriteJSON(w, http.StatusAccepted, published{MessageID: id, PaymentID: p.PaymentID, Amount: p.Amount, Action: "re-published with the same message-id"})
}

// redeliver puts the same message straight onto each endpoint's queue again,
// as a broker does after a lost acknowledgement.
func (a *app) redeliver(w http.ResponseWriter, r *http.Request) {
	p, id, err := parse(r)
	if err != nil {
		sample.WriteError(w, http.StatusBadRequest, err)
		return
	}
	for _, q := range []string{"email-notifications", "audit-log"} {
		if err := a.b.Send(r.Context(), q, p, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			sample.WriteError(w, http.StatusServiceUnavailable, err)
			return
		}
	}
	sample.WriteJSON(w, http.StatusAccepted, published{MessageID: id, PaymentID: p.PaymentID, Amount: p.Amount, Action: "redelivered to email-notifications and audit-log"})
}

type inboxEntry struct {
	MessageID    string     `json:"messageId"`
	ConsumerType string     `json:"consumerType"`
	ReceivedAt   time.Time  `json:"receivedAt"`
	ProcessedAt  *time.Time `json:"processedAt"`
	ExpiresAt    time.Time  `json:"expiresAt"`
	Attempts     int        `json:"attempts"`
}

func (a *app) inbox(w http.ResponseWriter, r *http.Request) {
	q := inbox.Query{MessageID: r.URL.Query().Get("messageId"), ConsumerType: r.URL.Query().Get("consumerType"), Limit: 100}
	es, err := a.b.InboxStore().List(r.Context(), q)
	if err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	out := make([]inboxEntry, 0, len(es))
	for _, e := range es {
		out = append(out, inboxEntry(e))
	}
	sample.WriteJSON(w, http.StatusOK, map[string]any{"count": len(out), "entries": out})
}

// deliveries records what each delivery's handling came to (bus.WithObserver),
// for the demo to tell.
type deliveries struct {
	mu     sync.Mutex
	events []bus.Event
}

func (d *deliveries) record(ev bus.Event) {
	if ev.Kind != bus.EventHandled {
		return
	}
	d.mu.Lock()
	d.events = append(d.events, bus.Event{Endpoint: ev.Endpoint, MessageID: ev.MessageID, Outcome: ev.Outcome, Err: ev.Err})
	d.mu.Unlock()
}

func (d *deliveries) of(id string) []bus.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []bus.Event
	for _, ev := range d.events {
		if ev.MessageID == id {
			out = append(out, ev)
		}
	}
	return out
}

// explain says in words what a delivery's outcome means.
func explain(ev bus.Event) string {
	switch ev.Outcome {
	case bus.OutcomeCommitted:
		return "processed: the consumer ran; its row and the inbox's processed mark committed in one transaction"
	case bus.OutcomeDuplicate:
		return "duplicate: the inbox already holds (message-id, " + ev.Endpoint + ") as processed, so the consumer did not run"
	}
	return ev.Outcome + ": " + fmt.Sprint(ev.Err)
}

// demo runs the scenario without HTTP: publish, re-publish twice, redeliver,
// then show what each delivery came to and what each consumer did.
func demo(ctx context.Context, b *bus.Bus, f sample.Flags, ds *deliveries) error {
	if err := migrate(b); err != nil {
		return err
	}
	fmt.Printf("inbox-deduplication on %s\n", f.Transport())
	// A fresh payment and message id per run: on a persistent database or
	// broker, what earlier runs left must not count towards this one.
	p := PaymentReceived{PaymentID: "pay-" + sample.RunID(), Amount: 42}
	id := uuid.NewString()
	before := b.Stats()
	send := func(what string, fn func() error) error {
		if err := fn(); err != nil {
			return err
		}
		fmt.Printf("  %-44s message-id %s\n", what, id)
		return nil
	}
	h := bus.Headers{bus.HeaderMessageID: id}
	steps := []struct {
		what string
		fn   func() error
	}{
		{"published PaymentReceived", func() error { return b.Publish(ctx, p, h) }},
		{"re-published it (same message-id)", func() error { return b.Publish(ctx, p, h) }},
		{"re-published it again (same message-id)", func() error { return b.Publish(ctx, p, h) }},
		{"redelivered it to email-notifications", func() error { return b.Send(ctx, "email-notifications", p, h) }},
	}
	fmt.Println("\nwhat the producer did (a publish reaches both endpoints; a redelivery puts the message on one")
	fmt.Println("endpoint's queue again, as a broker does when an acknowledgement is lost):")
	for _, s := range steps {
		if err := send(s.what, s.fn); err != nil {
			return err
		}
	}
	// 4 deliveries reach email-notifications and 3 reach audit-log: 2 are
	// processed, 5 are duplicates.
	seen := func(st bus.Stats) int64 {
		return st.Consumed - before.Consumed + st.Duplicates - before.Duplicates
	}
	for st := b.Stats(); seen(st) < 7 || len(ds.of(id)) < 7; st = b.Stats() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo timed out: %+v", st)
		case <-time.After(10 * time.Millisecond):
		}
	}
	var ns []Notification
	var as []AuditEntry
	if err := b.DB().Where("message_id = ?", id).Find(&ns).Error; err != nil {
		return err
	}
	if err := b.DB().Where("message_id = ?", id).Find(&as).Error; err != nil {
		return err
	}
	st := b.Stats()
	fmt.Println("\nwhat each delivery came to, in the order they ended (7 deliveries: 4 to email-notifications, 3 to audit-log):")
	for _, ev := range ds.of(id) {
		fmt.Printf("  %-20s %s\n", ev.Endpoint, explain(ev))
	}
	fmt.Printf("\ndeliveries: %d processed, %d duplicates skipped by the inbox\n", st.Consumed-before.Consumed, st.Duplicates-before.Duplicates)
	fmt.Printf("email-notifications sent %d notification(s):\n", len(ns))
	for _, n := range ns {
		fmt.Printf("  payment %s amount %.2f (message-id %s)\n", n.PaymentID, n.Amount, n.MessageID)
	}
	fmt.Printf("audit-log recorded %d entr(y/ies)\n", len(as))
	es, err := b.InboxStore().List(ctx, inbox.Query{MessageID: id})
	if err != nil {
		return err
	}
	fmt.Println("inbox:")
	for _, e := range es {
		state := "locked"
		if e.ProcessedAt != nil {
			state = "processed"
		}
		fmt.Printf("  %-22s %s  %s\n", e.ConsumerType, e.MessageID, state)
	}
	fmt.Println()
	var c sample.Checks
	c.Expect(len(ns) == 1, "email-notifications applied the payment exactly once (got %d)", len(ns))
	c.Expect(len(as) == 1, "audit-log applied it exactly once (got %d)", len(as))
	c.Expect(st.Duplicates-before.Duplicates == 5, "the inbox skipped the 5 duplicate deliveries (got %d)", st.Duplicates-before.Duplicates)
	return c.Err()
}
