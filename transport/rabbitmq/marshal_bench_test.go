package rabbitmq

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/outbox"
)

// Hot path of the relay: one outbox row becomes one AMQP publishing.
func BenchmarkToPublishing(b *testing.B) {
	m := &outbox.Message{
		ID: 42, MessageID: "0b4f6a8e-5c1d-4c55-9d0e-6f1f4f3b2a10", Destination: "exchange:OrderPlaced",
		MessageType: "OrderPlaced", ContentType: "application/json", CorrelationID: "corr-1",
		Headers:   map[string]string{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		Payload:   []byte(`{"orderId":"o-1","amount":12.5,"pad":"` + strings.Repeat("x", 200) + `"}`),
		CreatedAt: time.Now(),
	}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		_ = toPublishing(m, now)
	}
}

// Hot path of every consumer: one AMQP delivery becomes one Watermill
// message (headers copied as strings, properties mapped to headers).
func BenchmarkFromDelivery(b *testing.B) {
	d := amqp.Delivery{
		MessageId: "0b4f6a8e-5c1d-4c55-9d0e-6f1f4f3b2a10", CorrelationId: "corr-1", Type: "OrderPlaced",
		ContentType: "application/json", Exchange: "OrderPlaced", RoutingKey: "",
		Headers: amqp.Table{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		Body:    []byte(`{"orderId":"o-1","amount":12.5,"pad":"` + strings.Repeat("x", 200) + `"}`),
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = fromDelivery(&d)
	}
}

// A redelivered message from a dead-letter cycle carries RabbitMQ's own
// nested headers (x-death), rendered as JSON.
func BenchmarkFromDeliveryXDeath(b *testing.B) {
	d := amqp.Delivery{
		MessageId: "m-1", Type: "OrderPlaced", ContentType: "application/json", Exchange: "OrderPlaced",
		Headers: amqp.Table{
			"x-delivery-count": int64(3),
			"x-death": []any{amqp.Table{
				"count": int64(2), "reason": "expired", "queue": "orders_delay_5s", "exchange": "",
				"time": time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC), "routing-keys": []any{"orders"},
			}},
		},
		Body: []byte(`{"orderId":"o-1"}`),
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = fromDelivery(&d)
	}
}
