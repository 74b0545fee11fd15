package rabbitmq

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

func TestHeaderString(t *testing.T) {
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	cases := []struct {
		in   any
		want string
	}{
		{nil, ""},
		{"s", "s"},
		{[]byte("bytes"), "bytes"},
		{[]byte{0xff, 0xfe}, "//4="},
		{true, "true"},
		{int8(-8), "-8"},
		{int16(16), "16"},
		{int32(32), "32"},
		{int64(1 << 40), "1099511627776"},
		{uint8(8), "8"},
		{float32(1.5), "1.5"},
		{2.25, "2.25"},
		{ts, "2024-05-06T07:08:09Z"},
		{amqp.Decimal{Scale: 2, Value: 12345}, "123.45"},
		{amqp.Decimal{Scale: 3, Value: -5}, "-0.005"},
		{[]any{"a", int64(1)}, `["a",1]`},
		{amqp.Table{"count": int64(2), "time": ts, "routing-keys": []any{"q"}, "nested": amqp.Table{"b": true}},
			`{"count":2,"nested":{"b":true},"routing-keys":["q"],"time":"2024-05-06T07:08:09Z"}`},
	}
	for _, c := range cases {
		if got := headerString(c.in); got != c.want {
			t.Errorf("headerString(%#v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestToPublishing(t *testing.T) {
	created := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	p := toPublishing(&outbox.Message{
		MessageID:     "id-1",
		Destination:   "exchange:OrderPlaced",
		MessageType:   "OrderPlaced",
		ContentType:   "application/json",
		CorrelationID: "corr-1",
		Headers: map[string]string{
			"traceparent":            "00-abc-def-01",
			wire.HeaderMessageID:     "ignored-because-field-set",
			wire.HeaderCorrelationID: "ignored",
		},
		Payload:   []byte(`{}`),
		CreatedAt: created,
	}, time.Now())
	if p.MessageId != "id-1" || p.CorrelationId != "corr-1" || p.Type != "OrderPlaced" || p.ContentType != "application/json" {
		t.Errorf("properties: %+v", p)
	}
	if p.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery mode %d, want persistent", p.DeliveryMode)
	}
	if !p.Timestamp.Equal(created) {
		t.Errorf("timestamp %v", p.Timestamp)
	}
	if len(p.Headers) != 1 || p.Headers["traceparent"] != "00-abc-def-01" {
		t.Errorf("headers %v", p.Headers)
	}

	// Empty fields fall back to the headers.
	p = toPublishing(&outbox.Message{Headers: map[string]string{
		wire.HeaderMessageID: "h-id", wire.HeaderMessageType: "T", wire.HeaderContentType: "text/plain", wire.HeaderCorrelationID: "c",
	}}, time.Now())
	if p.MessageId != "h-id" || p.Type != "T" || p.ContentType != "text/plain" || p.CorrelationId != "c" || len(p.Headers) != 0 {
		t.Errorf("fallback: %+v", p)
	}
}

func TestFromDelivery(t *testing.T) {
	d := &amqp.Delivery{
		MessageId:     "m1",
		CorrelationId: "c1",
		Type:          "T",
		ContentType:   "application/json",
		Redelivered:   true,
		Headers: amqp.Table{
			"x-delivery-count": int64(3),
			"x-death":          []any{amqp.Table{"count": int64(1), "reason": "rejected"}},
			"custom":           "v",
		},
		Body: []byte("b"),
	}
	m := fromDelivery(d)
	want := map[string]string{
		wire.HeaderMessageID:        "m1",
		wire.HeaderCorrelationID:    "c1",
		wire.HeaderMessageType:      "T",
		wire.HeaderContentType:      "application/json",
		transport.MetaRedelivered:   "true",
		transport.MetaDeliveryCount: "3",
		"x-delivery-count":          "3",
		"x-death":                   `[{"count":1,"reason":"rejected"}]`,
		"custom":                    "v",
	}
	if m.UUID != "m1" {
		t.Errorf("uuid %q", m.UUID)
	}
	for k, v := range want {
		if got := m.Metadata.Get(k); got != v {
			t.Errorf("metadata %s = %q, want %q", k, got, v)
		}
	}

	// Watermill header as the fallback id; no id at all stays empty.
	m = fromDelivery(&amqp.Delivery{Headers: amqp.Table{wire.HeaderWatermillUUID: "w1", wire.HeaderMessageType: "H"}})
	if m.UUID != "w1" || m.Metadata.Get(wire.HeaderMessageType) != "H" {
		t.Errorf("watermill fallback: %q %v", m.UUID, m.Metadata)
	}
	// A plain client that sets only the message-id header; it wins over
	// the Watermill header.
	m = fromDelivery(&amqp.Delivery{Headers: amqp.Table{wire.HeaderMessageID: "h1", wire.HeaderWatermillUUID: "w1"}})
	if m.UUID != "h1" {
		t.Errorf("message-id header fallback: %q", m.UUID)
	}
	// The property wins over both headers.
	m = fromDelivery(&amqp.Delivery{MessageId: "p1", Headers: amqp.Table{wire.HeaderMessageID: "h1", wire.HeaderWatermillUUID: "w1"}})
	if m.UUID != "p1" || m.Metadata.Get(wire.HeaderMessageID) != "p1" {
		t.Errorf("property precedence: %q %v", m.UUID, m.Metadata)
	}
	// Type precedence for Watermill-native publishers: the type property,
	// then BW-MessageType, then CQRS's `name`, then the exchange.
	for _, c := range []struct {
		d    amqp.Delivery
		want string
	}{
		{amqp.Delivery{Type: "P", Exchange: "X", Headers: amqp.Table{wire.HeaderMessageType: "H", "name": "N"}}, "P"},
		{amqp.Delivery{Exchange: "X", Headers: amqp.Table{wire.HeaderMessageType: "H", "name": "N"}}, "H"},
		{amqp.Delivery{Exchange: "X", Headers: amqp.Table{"name": "N"}}, "N"},
		{amqp.Delivery{Exchange: "X"}, "X"},
		{amqp.Delivery{RoutingKey: "q"}, ""},
	} {
		if got := fromDelivery(&c.d).Metadata.Get(wire.HeaderMessageType); got != c.want {
			t.Errorf("type of %+v = %q, want %q", c.d, got, c.want)
		}
	}
	m = fromDelivery(&amqp.Delivery{})
	if m.UUID != "" || m.Metadata.Get(wire.HeaderMessageID) != "" {
		t.Errorf("invented an id: %q", m.UUID)
	}
}

func TestNewValidatesURLWithoutLeakingPassword(t *testing.T) {
	const pw = "Sup3rSecret"
	bad := []string{
		"http://user:" + pw + "@host/",
		"amqp://user:" + pw + "@host:notaport/",
		"amqp://user:" + pw + "@:5672/",
		"amqp://user:" + pw + "%zz@host/",
		"user:" + pw + "@host",
		"amqp://user:" + pw + "@host/?heartbeat=abc",
	}
	for _, u := range bad {
		_, err := open(u, nil, nil)
		if err == nil {
			t.Errorf("New(%q) accepted", u)
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("New(%q) error leaks the password: %v", u, err)
		}
		t.Logf("%v", err)
	}
	for _, u := range []string{"amqp://guest:guest@localhost:5672/", "amqps://u:p@host/vhost", "AMQP://host"} {
		if _, err := open(u, nil, nil); err != nil {
			t.Errorf("New(%q): %v", u, err)
		}
	}
	tr, err := open("amqp://user:"+pw+"@host/", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(tr.URL(), pw) || !strings.Contains(tr.URL(), "user:xxxxx@host") {
		t.Errorf("URL() = %q", tr.URL())
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPrefetchFor(t *testing.T) {
	// The QoS of the one consumer the handlers share: PrefetchCount over
	// the handlers, rounded up, times the handlers. Without group commit,
	// ConcurrentMessageLimit handlers.
	for _, c := range []struct{ prefetch, limit, want int }{{16, 8, 16}, {10, 4, 12}, {1, 1, 1}} {
		ep := newEndpoint(t, "prefetch", nil, func(e *endpoint.Endpoint) {
			e.PrefetchCount, e.ConcurrentMessageLimit, e.Batch.MaxMessages = c.prefetch, c.limit, 1
		})
		if got := prefetchFor(ep); got != c.want {
			t.Errorf("%d/%d: %d, want %d", c.prefetch, c.limit, got, c.want)
		}
	}
	// With group commit the bus subscribes BatchDeliveriesPerHandler times
	// per slot, and each handler can hold a message.
	for _, c := range []struct{ prefetch, limit, want int }{{80, 5, 80}, {20, 5, 20}, {8, 8, 32}} {
		ep := newEndpoint(t, "prefetch", nil, func(e *endpoint.Endpoint) { e.PrefetchCount, e.ConcurrentMessageLimit = c.prefetch, c.limit })
		if got := prefetchFor(ep); got != c.want {
			t.Errorf("group commit %d/%d: %d, want %d", c.prefetch, c.limit, got, c.want)
		}
	}
	if got := prefetchFor(nil); got != 1 { // a partition or reply queue: one handler, one message
		t.Errorf("no endpoint: %d", got)
	}
}
