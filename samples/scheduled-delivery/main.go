// Command scheduled-delivery shows durable scheduled messages. POST
// /reminders?in=10s&text=... publishes a ReminderDue with bus.Delay: the
// message waits in the outbox (not in the broker) until it is due, so it
// survives restarts of every process and needs no broker plugin. GET
// /reminders lists the reminders still scheduled and the ones delivered
// (with how late each arrived); DELETE /reminders/{id} cancels one that
// has not left yet (bus.CancelScheduled).
//
//	go run ./samples/scheduled-delivery -demo    # scripted run, prints and exits
//	go run ./samples/scheduled-delivery          # HTTP API on 127.0.0.1:8093
//
// Add -amqp-url and -postgres-dsn to run on RabbitMQ and PostgreSQL, or
// -transport postgres with -postgres-dsn to run on the PostgreSQL transport
// (see README.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// ReminderDue is the scheduled message.
type ReminderDue struct {
	ID    string    `json:"id"`
	Text  string    `json:"text"`
	DueAt time.Time `json:"dueAt"`
}

// DeliveredReminder is what the reminders consumer recorded, once per
// message.
type DeliveredReminder struct {
	ID          string    `json:"id" gorm:"primaryKey"`
	Text        string    `json:"text"`
	DueAt       time.Time `json:"dueAt"`
	DeliveredAt time.Time `json:"deliveredAt"`
	// LateMs is how long after its due time the consumer got it.
	LateMs int64 `json:"lateMs"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (DeliveredReminder) TableName() string { return "sample_delivered_reminders" }

const remindersEndpoint = "reminders"

// maxIn bounds ?in= so that a typo ("10h" for "10s") is visible, not a
// reminder kept for years.
const maxIn = 30 * 24 * time.Hour

func declare(c *endpoint.Endpoints) {
	c.ReceiveEndpoint(remindersEndpoint, func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, deliver)
	})
}

// deliver records the reminder through the consumer's transaction.
func deliver(ctx context.Context, c *endpoint.Context[ReminderDue]) error {
	now := time.Now().UTC()
	r := c.Message
	return bus.TxFromContext(ctx).Create(&DeliveredReminder{
		ID: r.ID, Text: r.Text, DueAt: r.DueAt, DeliveredAt: now, LateMs: now.Sub(r.DueAt).Milliseconds(),
	}).Error
}

func main() {
	f := sample.ParseFlags("127.0.0.1:8093")
	b, err := f.NewBus(declare, nil)
	if err != nil {
		log.Fatal(err)
	}
	a := &app{b: b}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reminders", a.post)
	mux.HandleFunc("GET /reminders", a.list)
	mux.HandleFunc("DELETE /reminders/{id}", a.cancel)
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, f) }, 0, func(context.Context) error { return a.migrate() }); err != nil {
		log.Fatal(err)
	}
}

type app struct{ b *bus.Bus }

func (a *app) migrate() error { return a.b.DB().AutoMigrate(&DeliveredReminder{}) }

// schedule publishes a reminder due in `in`. The reminder's id is its
// message id, chosen here, so that it can be cancelled later.
func (a *app) schedule(ctx context.Context, text string, in time.Duration) (ReminderDue, error) {
	r := ReminderDue{ID: bus.NewMessageID(), Text: text, DueAt: time.Now().Add(in).UTC()}
	// snippet:start schedule
	err := a.b.Publish(ctx, r, bus.Delay(in, bus.Headers{bus.HeaderMessageID: r.ID}))
	// snippet:end schedule
	return r, err
}

// cancelReminder cancels a reminder that has not left yet.
func (a *app) cancelReminder(ctx context.Context, id string) (bool, error) {
	// snippet:start cancel
	cancelled, err := a.b.CancelScheduled(ctx, id)
	// snippet:end cancel
	return cancelled, err
}

func (a *app) post(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Text string `json:"text"`
		In   string `json:"in"`
	}
	if err := sample.ReadJSON(w, r, &req); err != nil {
		sample.WriteError(w, http.StatusBadRequest, err)
		return
	}
	q := r.URL.Query()
	if v := q.Get("in"); v != "" {
		req.In = v
	}
	if v := q.Get("text"); v != "" {
		req.Text = v
	}
	if req.Text == "" {
		req.Text = "reminder"
	}
	in, err := time.ParseDuration(req.In)
	switch {
	case req.In == "":
		sample.WriteError(w, http.StatusBadRequest, errors.New(`in is required: a duration such as "10s" or "5m"`))
		return
	case err != nil:
		sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("in %q: %w", req.In, err))
		return
	case in < 0 || in > maxIn:
		sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("in %v: must be within 0s and %v", in, maxIn))
		return
	}
	rem, err := a.schedule(r.Context(), req.Text, in)
	if err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	sample.WriteJSON(w, http.StatusAccepted, rem)
}

// scheduled returns the reminders waiting in the outbox for their time.
func (a *app) scheduled(ctx context.Context) ([]ReminderDue, error) {
	var out []ReminderDue
	var after int64
	for {
		rows, err := a.b.OutboxStore().List(ctx, outbox.Query{Scheduled: true, AfterID: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, m := range rows {
			after = m.ID
			var r ReminderDue
			if !strings.HasSuffix(m.MessageType, "ReminderDue") || json.Unmarshal(m.Payload, &r) != nil {
				continue
			}
			out = append(out, r)
		}
		if len(rows) < 1000 {
			return out, nil
		}
	}
}

func (a *app) delivered(ctx context.Context) ([]DeliveredReminder, error) {
	var out []DeliveredReminder
	err := a.b.DB().WithContext(ctx).Order("delivered_at DESC").Limit(100).Find(&out).Error
	return out, err
}

func (a *app) list(w http.ResponseWriter, r *http.Request) {
	s, err := a.scheduled(r.Context())
	if err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	d, err := a.delivered(r.Context())
	if err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	sample.WriteJSON(w, http.StatusOK, map[string]any{"scheduled": s, "delivered": d})
}

func (a *app) cancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ok, err := a.cancelReminder(r.Context(), id)
	switch {
	case err != nil:
		sample.WriteError(w, http.StatusInternalServerError, err)
	case !ok:
		sample.WriteJSON(w, http.StatusNotFound, map[string]any{"id": id, "cancelled": false,
			"error": "no scheduled reminder with this id: it was delivered already (or is being delivered), was cancelled, or never existed"})
	default:
		sample.WriteJSON(w, http.StatusOK, map[string]any{"id": id, "cancelled": true})
	}
}

// demo schedules three reminders, cancels one, and checks that the other
// two arrive after their time, once, and the cancelled one never.
func (a *app) demo(ctx context.Context, f sample.Flags) error {
	if err := a.migrate(); err != nil {
		return err
	}
	fmt.Printf("scheduled-delivery on %s\n\n", f.Transport())
	run := sample.RunID()
	tea, err := a.schedule(ctx, "tea "+run, 1500*time.Millisecond)
	if err != nil {
		return err
	}
	call, err := a.schedule(ctx, "call "+run, 1000*time.Millisecond)
	if err != nil {
		return err
	}
	skip, err := a.schedule(ctx, "skip "+run, 1200*time.Millisecond)
	if err != nil {
		return err
	}
	for _, r := range []ReminderDue{call, skip, tea} {
		fmt.Printf("POST /reminders?in=…  %-14q due %s\n", r.Text, r.DueAt.Format("15:04:05.000"))
	}
	waiting, err := a.scheduled(ctx)
	if err != nil {
		return err
	}
	cancelled, err := a.cancelReminder(ctx, skip.ID)
	if err != nil {
		return err
	}
	fmt.Printf("DELETE /reminders/%s  cancelled=%v\n\n", skip.ID, cancelled)

	var got []DeliveredReminder
	if err := sample.WaitUntil(ctx, "the two reminders", func() (bool, error) {
		got = nil
		err := a.b.DB().WithContext(ctx).Where("id IN ?", []string{tea.ID, call.ID, skip.ID}).Order("delivered_at").Find(&got).Error
		return len(got) >= 2, err
	}); err != nil {
		return err
	}
	for _, d := range got {
		fmt.Printf("delivered %-14q %4d ms after its due time\n", d.Text, d.LateMs)
	}
	// tea was due after skip: had skip not been cancelled, it would have
	// arrived by now. Look once more after the bus is idle.
	if err := sample.WaitUntil(ctx, "the bus to be idle", func() (bool, error) {
		bl, err := a.b.Backlog(ctx)
		return err == nil && bl.Idle(), err
	}); err != nil {
		return err
	}
	var all []DeliveredReminder
	if err := a.b.DB().WithContext(ctx).Where("id IN ?", []string{tea.ID, call.ID, skip.ID}).Order("delivered_at").Find(&all).Error; err != nil {
		return err
	}
	fmt.Println()
	var c sample.Checks
	c.Expect(len(waiting) >= 3, "GET /reminders listed the 3 reminders as scheduled before any was due")
	c.Expect(cancelled, "DELETE /reminders/{id} cancelled the third before it was due")
	c.Expect(len(all) == 2 && all[0].ID == call.ID && all[1].ID == tea.ID, "the two others arrived, once each, in due order (%d rows)", len(all))
	for _, d := range all {
		c.Expect(d.LateMs >= 0, "%q arrived no earlier than its due time (%d ms late)", d.Text, d.LateMs)
	}
	again, err := a.cancelReminder(ctx, call.ID)
	if err != nil {
		return err
	}
	c.Expect(!again, "cancelling a reminder already delivered reports false")
	return c.Err()
}
