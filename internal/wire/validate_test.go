package wire_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 256)
	ok := func() *outbox.Message {
		return &outbox.Message{MessageID: "id-1", Destination: "exchange:Order", MessageType: "Order",
			ContentType: "application/json", CorrelationID: "c", Headers: map[string]string{"k": "v"}}
	}
	amqp := wire.Rules{MaxHeaderBytes: 128 << 10}
	for _, tc := range []struct {
		name  string
		edit  func(m *outbox.Message)
		rules wire.Rules
		want  string // substring of the error; "" = valid
	}{
		{"valid", func(*outbox.Message) {}, wire.Edge, ""},
		{"255-byte correlation id", func(m *outbox.Message) { m.CorrelationID = long[:255] }, wire.Edge, ""},
		{"256-byte correlation id", func(m *outbox.Message) { m.CorrelationID = long }, wire.Edge, "correlation id is 256 bytes; at most 255"},
		{"long correlation id, transport", func(m *outbox.Message) { m.CorrelationID = long }, amqp, "correlation id is 256 bytes"},
		{"long type", func(m *outbox.Message) { m.MessageType = long }, wire.Edge, "message type is 256 bytes"},
		{"long content type", func(m *outbox.Message) { m.ContentType = long }, wire.Edge, "content type is 256 bytes"},
		{"long routing key", func(m *outbox.Message) { m.RoutingKey = long }, wire.Edge, "routing key is 256 bytes"},
		{"long exchange", func(m *outbox.Message) { m.Destination = "exchange:" + long }, wire.Edge, "exchange name is 256 bytes"},
		{"long queue", func(m *outbox.Message) { m.Destination = "queue:" + long }, amqp, "queue name is 256 bytes"},
		{"long header key", func(m *outbox.Message) { m.Headers[long] = "v" }, amqp, "header key is 256 bytes"},
		{"long correlation header", func(m *outbox.Message) { m.Headers[wire.HeaderCorrelationID] = long }, amqp, `header "correlation-id" is 256 bytes`},
		{"long header value", func(m *outbox.Message) { m.Headers["k"] = strings.Repeat("v", 10000) }, wire.Edge, ""},
		{"headers over the frame", func(m *outbox.Message) { m.Headers["k"] = strings.Repeat("v", 70000) }, wire.Edge, "headers take"},
		{"201-byte id", func(m *outbox.Message) { m.MessageID = long[:201] }, wire.Edge, "message id is 201 bytes; at most 200"},
		{"long id, transport", func(m *outbox.Message) { m.MessageID = long + long }, amqp, ""},
		{"NUL in id", func(m *outbox.Message) { m.MessageID = "a\x00b" }, wire.Edge, "message id contains a NUL byte at offset 1"},
		{"NUL in id, transport", func(m *outbox.Message) { m.MessageID = "a\x00b" }, amqp, ""},
		{"bad UTF-8 id", func(m *outbox.Message) { m.MessageID = "\xff\xfe" }, wire.Edge, "message id is not valid UTF-8"},
		{"bad UTF-8 correlation id", func(m *outbox.Message) { m.CorrelationID = "\xc3" }, wire.Edge, "correlation id is not valid UTF-8"},
		{"NUL in header key", func(m *outbox.Message) { m.Headers["a\x00"] = "v" }, wire.Edge, "header key contains a NUL"},
		{"bad UTF-8 header value", func(m *outbox.Message) { m.Headers["k"] = "\xff" }, wire.Edge, `header "k" is not valid UTF-8`},
		{"NUL in header value", func(m *outbox.Message) { m.Headers["k"] = "\x00" }, wire.Edge, `header "k" contains a NUL`},
		{"NUL in routing key", func(m *outbox.Message) { m.RoutingKey = "\x00" }, wire.Edge, "routing key contains a NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := ok()
			tc.edit(m)
			err := wire.Validate(m, tc.rules)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v; want nil", err)
				}
				return
			}
			var ie *wire.InvalidError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v; want an *InvalidError containing %q", err, tc.want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	t.Parallel()
	if got := wire.Truncate("short", 10); got != "short" {
		t.Errorf("Truncate(short) = %q", got)
	}
	s := strings.Repeat("é", 100) // 2 bytes each
	got := wire.Truncate(s, 51)
	if len(got) > 51 || !strings.HasSuffix(got, "(truncated)") || !strings.HasPrefix(got, "é") {
		t.Errorf("Truncate = %q (%d bytes)", got, len(got))
	}
	if !utf8.ValidString(got) {
		t.Fatalf("cut inside a rune: %q", got)
	}
}

// BenchmarkValidate: the cost the edge rules add to every publish.
func BenchmarkValidate(b *testing.B) {
	m := &outbox.Message{MessageID: "0b9f5a4e-6a4c-4a43-9a59-0d2a3c6b1f7e", Destination: "exchange:OrderAccepted",
		MessageType: "OrderAccepted", ContentType: "application/json", CorrelationID: "order-42",
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}}
	for b.Loop() {
		if err := wire.Validate(m, wire.Edge); err != nil {
			b.Fatal(err)
		}
	}
}
