// Command transactional-outbox shows a business write and a published
// message committing together or not at all. POST /transfers writes a
// Transfer row and publishes TransferCompleted with bus.PublishTx in the
// same transaction (bus.Transaction): the event lands in the outbox table
// next to the transfer, and the relay sends it only once the transaction
// has committed. With ?fail=true the transaction fails after publishing and
// rolls back: no transfer, no outbox row, no message. A consumer endpoint,
// transfer-notifications, records every TransferCompleted it receives.
//
//	go run ./samples/transactional-outbox -demo    # scripted run, prints and exits
//	go run ./samples/transactional-outbox          # HTTP API on 127.0.0.1:8081
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
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// TransferCompleted is the event a committed transfer publishes.
type TransferCompleted struct {
	TransferID  string    `json:"transferId"`
	From        string    `json:"from"`
	To          string    `json:"to"`
	Amount      int64     `json:"amount"` // in cents
	CompletedAt time.Time `json:"completedAt"`
}

// Transfer is the business row written in the same transaction as the event.
type Transfer struct {
	ID        string    `json:"id" gorm:"primaryKey"`
	From      string    `json:"from" gorm:"column:from_account"`
	To        string    `json:"to" gorm:"column:to_account"`
	Amount    int64     `json:"amount"` // in cents
	CreatedAt time.Time `json:"createdAt"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (Transfer) TableName() string { return "sample_transfers" }

// ReceivedTransfer is what the transfer-notifications consumer recorded: one
// row per TransferCompleted message.
type ReceivedTransfer struct {
	MessageID  string    `json:"messageId" gorm:"primaryKey"`
	TransferID string    `json:"transferId" gorm:"index"`
	From       string    `json:"from" gorm:"column:from_account"`
	To         string    `json:"to" gorm:"column:to_account"`
	Amount     int64     `json:"amount"`
	ReceivedAt time.Time `json:"receivedAt"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (ReceivedTransfer) TableName() string { return "sample_transfer_events" }

const consumerEndpoint = "transfer-notifications"

// declare is the endpoint declaration, the same on every transport.
func declare(c *endpoint.Endpoints) {
	c.ReceiveEndpoint(consumerEndpoint, func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, recordTransfer)
	})
}

// recordTransfer writes through the consumer's transaction, so the row and
// the inbox's processed mark commit together: once per message.
func recordTransfer(ctx context.Context, c *endpoint.Context[TransferCompleted]) error {
	m := c.Message
	return bus.TxFromContext(ctx).Create(&ReceivedTransfer{
		MessageID: c.MessageID, TransferID: m.TransferID, From: m.From, To: m.To, Amount: m.Amount,
		ReceivedAt: time.Now().UTC(),
	}).Error
}

func main() {
	f := sample.ParseFlags("127.0.0.1:8081")
	b, err := f.NewBus(declare, nil)
	if err != nil {
		log.Fatal(err)
	}
	a := &app{b: b}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", a.postTransfer)
	mux.HandleFunc("GET /transfers", sample.Rows[Transfer](b, "transfers", "created_at DESC", 100, nil))
	mux.HandleFunc("GET /received", sample.Rows[ReceivedTransfer](b, "received", "received_at DESC", 100, nil))
	mux.HandleFunc("GET /outbox/pending", a.outboxPending)
	mux.HandleFunc("POST /outbox/requeue", a.outboxRequeue)
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, f) }, 0, func(context.Context) error { return a.migrate() }); err != nil {
		log.Fatal(err)
	}
}

type app struct{ b *bus.Bus }

func (a *app) migrate() error { return a.b.DB().AutoMigrate(&Transfer{}, &ReceivedTransfer{}) }

// errSimulated is the failure ?fail=true injects after the publish.
var errSimulated = errors.New("simulated failure after PublishTx: the transaction rolled back, so nothing was written or sent")

type transferRequest struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"` // in cents
	Fail   bool   `json:"fail"`
}

func (q transferRequest) validate() error {
	var problems []string
	if q.From == "" || q.To == "" {
		problems = append(problems, "from and to are required")
	} else if q.From == q.To {
		problems = append(problems, "from and to must differ")
	}
	if q.Amount <= 0 {
		problems = append(problems, "amount must be a positive number of cents")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// transfer writes the transfer and publishes its event in one transaction.
// The event's message-id is derived from the transfer id, so a retried
// request that reused the id would publish the same message, which
// consumers' inboxes absorb.
func (a *app) transfer(ctx context.Context, id string, q transferRequest) (Transfer, string, error) {
	t := Transfer{ID: id, From: q.From, To: q.To, Amount: q.Amount, CreatedAt: time.Now().UTC()}
	msgID := "transfer-" + id
	// snippet:start transaction
	err := a.b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := tx.Create(&t).Error; err != nil {
			return fmt.Errorf("insert transfer: %w", err)
		}
		ev := TransferCompleted{TransferID: t.ID, From: t.From, To: t.To, Amount: t.Amount, CompletedAt: t.CreatedAt}
		if err := a.b.PublishTx(ctx, tx, ev, bus.Headers{bus.HeaderMessageID: msgID}); err != nil {
			return err
		}
		if q.Fail {
			return errSimulated // rolls back the transfer row and the outbox row
		}
		return nil
	})
	// snippet:end transaction
	return t, msgID, err
}

func (a *app) postTransfer(w http.ResponseWriter, r *http.Request) {
	var req transferRequest
	if err := sample.ReadJSON(w, r, &req); err != nil {
		sample.WriteError(w, http.StatusBadRequest, err)
		return
	}
	qs := r.URL.Query()
	if v := qs.Get("from"); v != "" {
		req.From = v
	}
	if v := qs.Get("to"); v != "" {
		req.To = v
	}
	if v := qs.Get("amount"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("amount %q: a whole number of cents, please", v))
			return
		}
		req.Amount = n
	}
	if v := qs.Get("fail"); v != "" {
		fail, err := strconv.ParseBool(v)
		if err != nil {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("fail %q: %w", v, err))
			return
		}
		req.Fail = fail
	}
	if err := req.validate(); err != nil {
		sample.WriteError(w, http.StatusBadRequest, err)
		return
	}
	t, msgID, err := a.transfer(r.Context(), uuid.NewString(), req)
	switch {
	case errors.Is(err, errSimulated):
		sample.WriteJSON(w, http.StatusInternalServerError, map[string]any{
			"error": err.Error(), "transferId": t.ID, "messageId": msgID, "committed": false,
		})
	case err != nil:
		sample.WriteError(w, http.StatusInternalServerError, err)
	default:
		sample.WriteJSON(w, http.StatusCreated, map[string]any{"transfer": t, "messageId": msgID, "committed": true})
	}
}

// outboxRow is an outbox row as the HTTP API shows it.
type outboxRow struct {
	ID          int64           `json:"id"`
	MessageID   string          `json:"messageId"`
	MessageType string          `json:"messageType"`
	Destination string          `json:"destination"`
	Status      outbox.Status   `json:"status"`
	Attempts    int             `json:"attempts"`
	LastError   string          `json:"lastError,omitempty"`
	CreatedAt   time.Time       `json:"createdAt"`
	Payload     json.RawMessage `json:"payload"`
}

func viewRow(m *outbox.Message) outboxRow {
	payload := json.RawMessage(m.Payload)
	if !json.Valid(payload) {
		payload, _ = json.Marshal(string(m.Payload)) // marshalling a string cannot fail
	}
	return outboxRow{
		ID: m.ID, MessageID: m.MessageID, MessageType: m.MessageType, Destination: m.Destination,
		Status: m.Status, Attempts: m.Attempts, LastError: m.LastError, CreatedAt: m.CreatedAt, Payload: payload,
	}
}

type outboxStats struct {
	Pending       int64      `json:"pending"`
	Parked        int64      `json:"parked"`
	OldestPending *time.Time `json:"oldestPending,omitempty"`
}

func viewStats(s outbox.Stats) outboxStats {
	v := outboxStats{Pending: s.Pending, Parked: s.Parked}
	if !s.OldestPending.IsZero() {
		v.OldestPending = &s.OldestPending
	}
	return v
}

// outboxPending shows the rows the relay has not delivered yet: pending
// (committed, waiting for the broker's confirm) and parked (failed
// MaxAttempts times, waiting for POST /outbox/requeue).
func (a *app) outboxPending(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	st := a.b.OutboxStore()
	stats, err := st.Stats(ctx)
	if err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	out := map[string]any{"stats": viewStats(stats)}
	for _, s := range []outbox.Status{outbox.StatusPending, outbox.StatusParked} {
		ms, err := st.List(ctx, outbox.Query{Status: s, Limit: 100})
		if err != nil {
			sample.WriteError(w, http.StatusInternalServerError, err)
			return
		}
		rows := make([]outboxRow, 0, len(ms))
		for _, m := range ms {
			rows = append(rows, viewRow(m))
		}
		out[string(s)] = rows
	}
	sample.WriteJSON(w, http.StatusOK, out)
}

// outboxRequeue moves parked rows back to pending: those named by ?id=1,2,
// or all of them.
func (a *app) outboxRequeue(w http.ResponseWriter, r *http.Request) {
	var ids []int64
	if v := r.URL.Query().Get("id"); v != "" {
		for _, s := range strings.Split(v, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("id %q: %w", s, err))
				return
			}
			ids = append(ids, id)
		}
	}
	n, err := a.b.OutboxStore().Requeue(r.Context(), ids)
	if err != nil {
		sample.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	sample.WriteJSON(w, http.StatusOK, map[string]any{"requeued": n})
}

// outboxRows returns the outbox rows whose message ids are in ids, paging
// through the table (the store has no look-up by message id).
func (a *app) outboxRows(ctx context.Context, ids []string) (map[string]*outbox.Message, error) {
	found := map[string]*outbox.Message{}
	var after int64
	for {
		ms, err := a.b.OutboxStore().List(ctx, outbox.Query{AfterID: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if slices.Contains(ids, m.MessageID) {
				found[m.MessageID] = m
			}
			after = m.ID
		}
		if len(ms) < 1000 {
			return found, nil
		}
	}
}

// queued counts the PostgreSQL transport's queue rows that carry message
// id, in the transport's table (pgtransport.DefaultTablePrefix).
func (a *app) queued(ctx context.Context, id string) (int64, error) {
	var n int64
	err := a.b.DB().WithContext(ctx).Raw("SELECT count(*) FROM barewire_queue_messages WHERE message_id = ?", id).Scan(&n).Error
	return n, err
}

func cents(n int64) string { return fmt.Sprintf("%d.%02d", n/100, n%100) }

// demo commits a transfer, fails one after publishing, commits another, and
// checks that exactly the committed ones were written, sent and received.
func (a *app) demo(ctx context.Context, f sample.Flags) error {
	if err := a.migrate(); err != nil {
		return err
	}
	fmt.Printf("transactional-outbox on %s\n\n", f.Transport())
	// On the PostgreSQL transport PublishTx writes the event straight to
	// the consumer's queue table in the same transaction: no outbox row, no
	// relay hop. Everywhere else it goes through the outbox and the relay.
	direct := f.Is(sample.TransportPostgres)
	landed := "TransferCompleted in the outbox"
	if direct {
		landed = "TransferCompleted written to the " + consumerEndpoint + " queue table"
	}
	run := sample.RunID()
	steps := []struct {
		id  string
		req transferRequest
	}{
		{"t-" + run + "-1", transferRequest{From: "alice", To: "bob", Amount: 2500}},
		{"t-" + run + "-2", transferRequest{From: "bob", To: "carol", Amount: 990, Fail: true}},
		{"t-" + run + "-3", transferRequest{From: "carol", To: "dave", Amount: 1200}},
	}
	var committed, rolledBack, allIDs, allMsgIDs []string
	for _, s := range steps {
		_, msgID, err := a.transfer(ctx, s.id, s.req)
		allIDs = append(allIDs, s.id)
		allMsgIDs = append(allMsgIDs, msgID)
		switch {
		case err == nil:
			committed = append(committed, s.id)
			fmt.Printf("POST /transfers %-5s → %-5s %8s  committed; %s (message-id %s)\n", s.req.From, s.req.To, cents(s.req.Amount), landed, msgID)
		case errors.Is(err, errSimulated):
			rolledBack = append(rolledBack, s.id)
			fmt.Printf("POST /transfers %-5s → %-5s %8s  fail=true: published, then the transaction rolled back\n", s.req.From, s.req.To, cents(s.req.Amount))
		default:
			return err
		}
	}

	// Wait until the committed transfers' events were received and (with
	// an outbox hop) the relay recorded the transport's confirms.
	var received []ReceivedTransfer
	err := sample.WaitUntil(ctx, "the committed transfers' events", func() (bool, error) {
		received = nil
		if err := a.b.DB().WithContext(ctx).Where("transfer_id IN ?", allIDs).Find(&received).Error; err != nil {
			return false, err
		}
		if len(received) < len(committed) || direct {
			return len(received) >= len(committed), nil
		}
		rows, err := a.outboxRows(ctx, allMsgIDs)
		if err != nil {
			return false, err
		}
		for _, id := range committed {
			if m := rows["transfer-"+id]; m == nil || m.Status != outbox.StatusDelivered {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	// Give a (wrongly) sent event of the rolled-back transfer time to arrive.
	time.Sleep(300 * time.Millisecond)
	received = nil
	if err := a.b.DB().WithContext(ctx).Where("transfer_id IN ?", allIDs).Order("received_at").Find(&received).Error; err != nil {
		return err
	}
	var transfers []Transfer
	if err := a.b.DB().WithContext(ctx).Where("id IN ?", allIDs).Find(&transfers).Error; err != nil {
		return err
	}
	rows, err := a.outboxRows(ctx, allMsgIDs)
	if err != nil {
		return err
	}
	stats, err := a.b.OutboxStore().Stats(ctx)
	if err != nil {
		return err
	}

	fmt.Printf("\n%s received %d TransferCompleted event(s):\n", consumerEndpoint, len(received))
	for _, r := range received {
		fmt.Printf("  %s  %s → %s %s  (message-id %s)\n", r.TransferID, r.From, r.To, cents(r.Amount), r.MessageID)
	}
	fmt.Println("outbox rows of this run:")
	for _, id := range allMsgIDs {
		if m, ok := rows[id]; ok {
			fmt.Printf("  #%-4d %-32s %-9s attempts %d\n", m.ID, id, m.Status, m.Attempts)
		} else {
			fmt.Printf("  -     %-32s none\n", id)
		}
	}
	fmt.Printf("outbox table: %d pending, %d parked\n\n", stats.Pending, stats.Parked)

	var c sample.Checks
	gotTransfers := map[string]bool{}
	for _, t := range transfers {
		gotTransfers[t.ID] = true
	}
	gotEvents := map[string]int{}
	for _, r := range received {
		gotEvents[r.TransferID]++
	}
	for _, id := range committed {
		c.Expect(gotTransfers[id], "committed %s: in the transfers table", id)
		c.Expect(gotEvents[id] == 1, "committed %s: TransferCompleted received exactly once (got %d)", id, gotEvents[id])
		m := rows["transfer-"+id]
		if direct {
			c.Expect(m == nil, "committed %s: no outbox row (written to the queue in the transaction)", id)
		} else {
			c.Expect(m != nil && m.Status == outbox.StatusDelivered, "committed %s: its outbox row is delivered", id)
		}
	}
	for _, id := range rolledBack {
		c.Expect(!gotTransfers[id], "rolled back %s: not in the transfers table", id)
		c.Expect(gotEvents[id] == 0, "rolled back %s: TransferCompleted never received (got %d)", id, gotEvents[id])
		c.Expect(rows["transfer-"+id] == nil, "rolled back %s: no outbox row", id)
		if direct {
			n, err := a.queued(ctx, "transfer-"+id)
			c.Expect(err == nil && n == 0, "rolled back %s: no row in the queue table (got %d, %v)", id, n, err)
		}
	}
	return c.Err()
}
