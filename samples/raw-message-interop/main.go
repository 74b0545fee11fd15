// Command raw-message-interop shows a BareWire endpoint receiving messages
// from a producer that knows nothing about BareWire: a plain AMQP client
// (github.com/rabbitmq/amqp091-go) publishing to the endpoint's queue with
// AMQP properties (message_id, type, content_type, correlation_id) and
// custom headers. A RawConsumer on the legacy-inbound endpoint records each
// message's headers and body as it got them. The message_id property is the
// inbox key: re-publishing the same message_id is absorbed as a duplicate,
// and a message with no message_id is dead-lettered to legacy-inbound_error
// (the endpoint's MissingMessageID policy, RejectMissingID by default).
//
// With -transport rabbitmq (-amqp-url) the producer really is a separate
// plain AMQP connection. With -transport postgres it is a plain SQL INSERT
// into the transport's queue table (see sqlProducer), as a service in any
// language could write it. On the embedded default there is nothing outside
// the process to produce with, so the sample simulates the producer with
// bus.Send of a bus.Raw carrying the same properties as headers.
//
//	go run ./samples/raw-message-interop -demo   # scripted run, prints and exits
//	go run ./samples/raw-message-interop         # HTTP API on 127.0.0.1:8085
//	go run ./samples/raw-message-interop -amqp-url amqp://guest:guest@127.0.0.1:5672/ -demo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

const inboundQueue = "legacy-inbound"

// RawReceived is one message as the RawConsumer received it.
type RawReceived struct {
	ID            int64             `json:"-" gorm:"primaryKey"`
	MessageID     string            `json:"messageId" gorm:"index"`
	MessageType   string            `json:"messageType"`
	ContentType   string            `json:"contentType"`
	CorrelationID string            `json:"correlationId"`
	Headers       map[string]string `json:"headers" gorm:"serializer:json;type:text"`
	Body          string            `json:"body"`
	ReceivedAt    time.Time         `json:"receivedAt"`
}

// TableName keeps the sample's table apart from other programs' tables.
func (RawReceived) TableName() string { return "sample_raw_messages" }

func declare(c *endpoint.Endpoints) {
	c.ReceiveEndpoint(inboundQueue, func(e *endpoint.Endpoint) {
		// A RawConsumer without ForTypes is the endpoint's catch-all: it
		// gets every message, typed or not, as bytes and headers.
		endpoint.RawConsumer(e, recordRaw)
	})
}

// recordRaw writes through the consumer's transaction: with the inbox's
// processed mark, so once per message_id.
func recordRaw(ctx context.Context, d *endpoint.Delivery) error {
	return bus.TxFromContext(ctx).Create(&RawReceived{
		MessageID: d.MessageID, MessageType: d.MessageType, ContentType: d.ContentType, CorrelationID: d.CorrelationID,
		Headers: maps.Clone(d.Headers), Body: string(d.Body), ReceivedAt: time.Now().UTC(),
	}).Error
}

// rawMessage is what the foreign producer sends.
type rawMessage struct {
	MessageID     string // empty: no message_id property
	Type          string
	ContentType   string
	CorrelationID string
	Headers       amqp.Table
	Body          []byte
}

// producer is the foreign producer: plain AMQP, or simulated with the bus.
type producer interface {
	Publish(ctx context.Context, m rawMessage) error
	Describe() string
	Close() error
}

// amqpProducer publishes with a plain amqp091 connection of its own, to the
// default exchange with the queue's name as routing key, and waits for the
// broker's confirm.
type amqpProducer struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
}

func (p *amqpProducer) Describe() string {
	return "plain amqp091 client, default exchange, routing key " + inboundQueue
}

// channel returns an open confirm-mode channel, reconnecting if needed.
func (p *amqpProducer) channel() (*amqp.Channel, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := amqp.DialConfig(p.url, amqp.Config{
			Properties: amqp.Table{"connection_name": "raw-message-interop plain producer"},
		})
		if err != nil {
			return nil, fmt.Errorf("plain AMQP producer: connect: %w", err)
		}
		p.conn = conn
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("plain AMQP producer: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("plain AMQP producer: confirm mode: %w", err)
	}
	p.ch = ch
	return ch, nil
}

func (p *amqpProducer) Publish(ctx context.Context, m rawMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, err := p.channel()
	if err != nil {
		return err
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", inboundQueue, false, false, amqp.Publishing{
		MessageId:     m.MessageID,
		Type:          m.Type,
		ContentType:   m.ContentType,
		CorrelationId: m.CorrelationID,
		Headers:       m.Headers,
		DeliveryMode:  amqp.Persistent,
		Timestamp:     time.Now().UTC(),
		AppId:         "legacy-erp",
		Body:          m.Body,
	})
	if err != nil {
		return fmt.Errorf("plain AMQP producer: publish: %w", err)
	}
	acked, err := conf.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("plain AMQP producer: confirm: %w", err)
	}
	if !acked {
		return errors.New("plain AMQP producer: the broker nacked the message")
	}
	return nil
}

func (p *amqpProducer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil || p.conn.IsClosed() {
		return nil
	}
	return p.conn.Close()
}

// busProducer simulates the foreign producer on the embedded transport: the
// AMQP properties become the headers the bus maps them from.
type busProducer struct{ b *bus.Bus }

func (p busProducer) Describe() string {
	return "simulated with bus.Send of a bus.Raw (no broker on this transport)"
}

func (p busProducer) Publish(ctx context.Context, m rawMessage) error {
	if m.MessageID == "" {
		return errors.New("the bus cannot send a message without an id (it always assigns one); run with -transport rabbitmq (-amqp-url) to try it")
	}
	h := bus.Headers{bus.HeaderMessageID: m.MessageID}
	if m.CorrelationID != "" {
		h[bus.HeaderCorrelationID] = m.CorrelationID
	}
	for k, v := range m.Headers {
		h[k] = fmt.Sprint(v)
	}
	return p.b.Send(ctx, inboundQueue, bus.Raw{Type: m.Type, ContentType: m.ContentType, Body: m.Body}, h)
}

func (busProducer) Close() error { return nil }

// sqlProducer is the foreign producer on the PostgreSQL transport: a plain
// SQL INSERT into the transport's queue table, as a service in any language
// (or a database trigger) can write it. No BareWire code is involved.
type sqlProducer struct{ b *bus.Bus }

// snippet:start sql-producer
// A message for the legacy-inbound endpoint on the PostgreSQL transport is
// one row in its queue: the id, the headers as a JSON object of strings
// (BW-MessageType, content-type and correlation-id included) and the body
// as bytes. The NOTIFY, sent after the commit, wakes an idle consumer at
// once; without it the consumer finds the row within its PollInterval.
const (
	insertMessageSQL = `INSERT INTO barewire_queue_messages (queue, message_id, metadata, payload)
VALUES ($1, $2, $3::json, $4)`
	notifySQL = `SELECT pg_notify('barewire_queue_messages', 'queue:' || $1)`
)

// snippet:end sql-producer

func (p sqlProducer) Describe() string {
	return "plain SQL: INSERT INTO barewire_queue_messages, then pg_notify (no BareWire code)"
}

func (p sqlProducer) Publish(ctx context.Context, m rawMessage) error {
	headers := map[string]string{"BW-MessageType": m.Type, "content-type": m.ContentType, "correlation-id": m.CorrelationID}
	for k, v := range m.Headers {
		headers[k] = fmt.Sprint(v)
	}
	for k, v := range headers {
		if v == "" {
			delete(headers, k)
		}
	}
	meta, err := json.Marshal(headers)
	if err != nil {
		return fmt.Errorf("SQL producer: headers: %w", err)
	}
	sqlDB, err := p.b.DB().DB()
	if err != nil {
		return fmt.Errorf("SQL producer: %w", err)
	}
	if _, err := sqlDB.ExecContext(ctx, insertMessageSQL, inboundQueue, m.MessageID, string(meta), m.Body); err != nil {
		return fmt.Errorf("SQL producer: insert: %w", err)
	}
	if _, err := sqlDB.ExecContext(ctx, notifySQL, inboundQueue); err != nil {
		return fmt.Errorf("SQL producer: notify: %w", err)
	}
	return nil
}

func (sqlProducer) Close() error { return nil }

func main() {
	f := sample.ParseFlags("127.0.0.1:8085")
	b, err := f.NewBus(declare, nil)
	if err != nil {
		log.Fatal(err)
	}
	var p producer = busProducer{b}
	switch {
	case f.Is(sample.TransportRabbitMQ):
		p = &amqpProducer{url: f.AMQPURL}
	case f.Is(sample.TransportPostgres):
		p = sqlProducer{b}
	}
	defer func() {
		if err := p.Close(); err != nil {
			log.Printf("close producer: %v", err)
		}
	}()
	// A real foreign producer (AMQP or SQL) can send a message without an id.
	a := &app{b: b, p: p, foreign: f.Is(sample.TransportRabbitMQ) || f.Is(sample.TransportPostgres)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /raw", a.postRaw)
	mux.HandleFunc("GET /received", sample.Rows[RawReceived](b, "received", "id DESC", 100, map[string]string{"messageId": "message_id"}))
	if err := f.Run(b, mux, func(ctx context.Context) error { return a.demo(ctx, f) }, 0, func(context.Context) error { return a.migrate() }); err != nil {
		_ = p.Close()
		log.Fatal(err)
	}
}

type app struct {
	b       *bus.Bus
	p       producer
	foreign bool // the producer is not the bus: it can omit the message id
}

func (a *app) migrate() error { return a.b.DB().AutoMigrate(&RawReceived{}) }

// postRaw publishes one message from the foreign producer. Query parameters:
// body, messageId (default: a new UUID; noMessageId=true sends none),
// type, contentType (default text/plain), correlationId, and header=name:value
// (repeatable).
func (a *app) postRaw(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	m := rawMessage{
		MessageID: q.Get("messageId"), Type: q.Get("type"), ContentType: q.Get("contentType"),
		CorrelationID: q.Get("correlationId"), Body: []byte(q.Get("body")),
		Headers: amqp.Table{"x-source": "legacy-erp"},
	}
	if len(m.Body) == 0 {
		sample.WriteError(w, http.StatusBadRequest, errors.New("body is required (?body=hello)"))
		return
	}
	if m.ContentType == "" {
		m.ContentType = "text/plain"
	}
	noID := false
	if v := q.Get("noMessageId"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("noMessageId %q: %w", v, err))
			return
		}
		noID = b
	}
	switch {
	case noID && m.MessageID != "":
		sample.WriteError(w, http.StatusBadRequest, errors.New("give messageId or noMessageId=true, not both"))
		return
	case !noID && m.MessageID == "":
		m.MessageID = uuid.NewString()
	}
	for _, hv := range q["header"] {
		k, v, ok := strings.Cut(hv, ":")
		if !ok || k == "" {
			sample.WriteError(w, http.StatusBadRequest, fmt.Errorf("header %q: use name:value", hv))
			return
		}
		m.Headers[k] = v
	}
	if err := a.p.Publish(r.Context(), m); err != nil {
		status := http.StatusServiceUnavailable
		if noID && !a.foreign {
			status = http.StatusBadRequest
		}
		sample.WriteError(w, status, err)
		return
	}
	sample.WriteJSON(w, http.StatusAccepted, map[string]any{
		"messageId": m.MessageID, "type": m.Type, "contentType": m.ContentType, "correlationId": m.CorrelationID,
		"headers": m.Headers, "body": string(m.Body), "producer": a.p.Describe(),
	})
}

// demo publishes a JSON message with custom headers, the same message again,
// a text message, and (on RabbitMQ) a message without message_id, then
// checks what the RawConsumer recorded.
func (a *app) demo(ctx context.Context, f sample.Flags) error {
	if err := a.migrate(); err != nil {
		return err
	}
	fmt.Printf("raw-message-interop on %s\nproducer: %s\n\n", f.Transport(), a.p.Describe())
	run := sample.RunID()
	jsonMsg := rawMessage{
		MessageID: "legacy-" + run + "-1", Type: "LegacyStockAdjusted", ContentType: "application/json",
		CorrelationID: "batch-" + run, Body: []byte(`{"sku":"X-100","delta":-3}`),
		Headers: amqp.Table{"x-source": "legacy-erp", "x-tenant": "acme", "x-schema-version": int32(2)},
	}
	textMsg := rawMessage{
		MessageID: "legacy-" + run + "-2", ContentType: "text/plain",
		Body: []byte("plain text from a producer that knows nothing of BareWire"), Headers: amqp.Table{"x-source": "legacy-erp"},
	}
	noIDMsg := rawMessage{ContentType: "text/plain", Body: []byte("no message_id " + run), Headers: amqp.Table{"x-source": "legacy-erp"}}
	before := a.b.Stats()
	steps := []struct {
		what string
		m    rawMessage
	}{
		{"JSON with custom headers", jsonMsg},
		{"the same message_id again", jsonMsg},
		{"plain text, no type", textMsg},
	}
	if a.foreign {
		steps = append(steps, struct {
			what string
			m    rawMessage
		}{"without message_id", noIDMsg})
	}
	for _, s := range steps {
		if err := a.p.Publish(ctx, s.m); err != nil {
			return err
		}
		id := s.m.MessageID
		if id == "" {
			id = "(none)"
		}
		fmt.Printf("published %-27s message_id %s\n", s.what, id)
	}
	if !a.foreign {
		fmt.Println("(a message without message_id needs -transport rabbitmq or postgres: the bus itself always assigns an id)")
	}

	ids := []string{jsonMsg.MessageID, textMsg.MessageID}
	var rs []RawReceived
	err := sample.WaitUntil(ctx, "the messages to be received and the duplicate absorbed", func() (bool, error) {
		rs = nil
		if err := a.b.DB().WithContext(ctx).Where("message_id IN ?", ids).Order("id").Find(&rs).Error; err != nil {
			return false, err
		}
		st := a.b.Stats()
		done := len(rs) >= 2 && st.Duplicates > before.Duplicates
		if a.foreign {
			done = done && st.DeadLettered > before.DeadLettered
		}
		return done, nil
	})
	if err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond) // let a (wrong) extra delivery show up
	rs = nil
	if err := a.b.DB().WithContext(ctx).Where("message_id IN ?", ids).Order("id").Find(&rs).Error; err != nil {
		return err
	}
	st := a.b.Stats()
	fmt.Printf("\n%s's RawConsumer recorded %d message(s):\n", inboundQueue, len(rs))
	byID := map[string][]RawReceived{}
	for _, r := range rs {
		byID[r.MessageID] = append(byID[r.MessageID], r)
		fmt.Printf("  message_id %s  type %q  content-type %s  correlation-id %q\n", r.MessageID, r.MessageType, r.ContentType, r.CorrelationID)
		for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
			fmt.Printf("      %-18s %s\n", k+":", r.Headers[k])
		}
		fmt.Printf("      body: %s\n", r.Body)
	}
	fmt.Printf("bus stats: %d consumed, %d duplicates absorbed, %d dead-lettered\n\n",
		st.Consumed-before.Consumed, st.Duplicates-before.Duplicates, st.DeadLettered-before.DeadLettered)

	var c sample.Checks
	c.Expect(len(byID[jsonMsg.MessageID]) == 1, "the JSON message was recorded once although published twice (got %d)", len(byID[jsonMsg.MessageID]))
	c.Expect(len(byID[textMsg.MessageID]) == 1, "the text message was recorded once (got %d)", len(byID[textMsg.MessageID]))
	c.Expect(st.Duplicates-before.Duplicates == 1, "the inbox absorbed 1 duplicate")
	if got := byID[jsonMsg.MessageID]; len(got) > 0 {
		r := got[0]
		c.Expect(r.Body == string(jsonMsg.Body), "the body arrived byte for byte")
		c.Expect(r.MessageType == jsonMsg.Type && r.ContentType == jsonMsg.ContentType && r.CorrelationID == jsonMsg.CorrelationID,
			"type, content type and correlation id arrived from the properties")
		c.Expect(r.Headers["x-source"] == "legacy-erp" && r.Headers["x-tenant"] == "acme", "the custom headers arrived")
		c.Expect(r.Headers["x-schema-version"] == "2", "a non-string header (int32 2) reads as the string %q (got %q)", "2", r.Headers["x-schema-version"])
	}
	if a.foreign {
		c.Expect(st.DeadLettered-before.DeadLettered == 1, "the message without message_id was dead-lettered to %s_error, not processed", inboundQueue)
	}
	return c.Err()
}
