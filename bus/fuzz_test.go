package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

const amqpShortString = 255

// amqpEncodable checks, independently of the transport's code, what the
// AMQP 0-9-1 encoder requires of a basic.publish and its content header:
// every short string (exchange, routing key, each property, each header
// key, also nested) at most 255 bytes, every header value of a type the
// client can encode.
func amqpEncodable(exchange, key string, p amqp.Publishing) error {
	for name, v := range map[string]string{
		"exchange": exchange, "routing key": key, "content_type": p.ContentType,
		"content_encoding": p.ContentEncoding, "correlation_id": p.CorrelationId, "reply_to": p.ReplyTo,
		"expiration": p.Expiration, "message_id": p.MessageId, "type": p.Type, "user_id": p.UserId, "app_id": p.AppId,
	} {
		if len(v) > amqpShortString {
			return fmt.Errorf("%s is %d bytes, over the AMQP short string limit of 255", name, len(v))
		}
	}
	if err := p.Headers.Validate(); err != nil {
		return fmt.Errorf("headers: %w", err)
	}
	var keys func(t amqp.Table) error
	keys = func(t amqp.Table) error {
		for k, v := range t {
			if len(k) > amqpShortString {
				return fmt.Errorf("header key of %d bytes, over the AMQP short string limit of 255", len(k))
			}
			if inner, ok := v.(amqp.Table); ok {
				if err := keys(inner); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return keys(p.Headers)
}

// FuzzEnvelopeAMQP: whatever headers, ids, types and destination a caller
// passes, the bus's envelope either refuses them with an error wrapping
// ErrInvalidMessage (or ErrMessageTooLarge), or builds a message whose
// actual AMQP publishing (the RabbitMQ transport's own mapping) the client
// can encode. FuzzEnvelope checks the same envelope against the stores'
// limits. Seeds: the poison cases of issue 14.
func FuzzEnvelopeAMQP(f *testing.F) {
	long := strings.Repeat("c", 300)
	type seed struct{ dest, id, corr, typ, ct, key, exchange, hk, hv string }
	for _, s := range []seed{
		{typ: "OrderPlaced"},
		{dest: "orders", id: "m-1", corr: "c-1", hk: "tenant", hv: "acme"},
		{typ: "T", corr: long},                   // accepted before the publish-edge fix (6adf53b)
		{typ: long},                              // accepted before the publish-edge fix: type (and exchange) 300 bytes
		{typ: "T", ct: long},                     // accepted before the publish-edge fix
		{typ: "T", key: long, exchange: "x"},     // accepted before the publish-edge fix: routing key
		{typ: "T", exchange: long},               // accepted before the publish-edge fix: exchange name
		{typ: "T", hk: long, hv: "v"},            // accepted before the publish-edge fix: header key
		{dest: "queue:" + long},                  // accepted before the publish-edge fix: queue name (routing key)
		{typ: "T", id: strings.Repeat("i", 201)}, // refused: id over the inbox bound
		{typ: "T", id: strings.Repeat("i", 300)},
		{typ: "a\x00b"},
		{typ: "T", id: "a\x00b"},
		{typ: "T", id: "\xff\xfe"},
		{typ: "T", corr: "\xff"},
		{dest: "exchange:"},
		{dest: "queue:q", hk: "message-id", hv: long},
	} {
		f.Add(s.dest, s.id, s.corr, s.typ, s.ct, s.key, s.exchange, s.hk, s.hv, []byte(`{}`))
	}
	b := &Bus{cfg: config{serializer: endpoint.JSON, maxMessageSize: 1 << 20}}
	f.Fuzz(func(t *testing.T, dest, id, corr, typ, ct, key, exchange, hk, hv string, body []byte) {
		h := Headers{}
		for k, v := range map[string]string{HeaderMessageID: id, HeaderCorrelationID: corr, HeaderMessageType: typ,
			HeaderContentType: ct, HeaderRoutingKey: key, HeaderExchange: exchange} {
			if v != "" {
				h[k] = v
			}
		}
		if hk != "" {
			h[hk] = hv
		}
		m, _, err := b.envelope(dest, Raw{Body: body}, h)
		if err != nil {
			if !errors.Is(err, ErrInvalidMessage) && !errors.Is(err, ErrMessageTooLarge) {
				t.Fatalf("error %q wraps neither ErrInvalidMessage nor ErrMessageTooLarge", err)
			}
			return
		}
		if m.MessageID == "" || m.Destination == "" {
			t.Fatalf("accepted without an id or destination: %+v", m)
		}
		if err := amqpEncodable(rabbitmq.PublishingFor(m)); err != nil {
			t.Fatalf("accepted a message RabbitMQ cannot carry: %v", err)
		}
	})
}

type fuzzTyped struct {
	N int `json:"n"`
}

// FuzzDispatch: whatever id, type and body a delivery has, the endpoint
// reaches a terminal outcome (processed once, a duplicate, or
// dead-lettered with a reason) and acknowledges it; it never requeues and
// never panics. Runs on the embedded default (SQLite, in-process).
func FuzzDispatch(f *testing.F) {
	for _, s := range []struct {
		id, typ string
		body    []byte
	}{
		{"m-1", "Known", []byte(`{}`)},
		{"m-2", "Typed", []byte(`{"n":1}`)},
		{"m-3", "Typed", []byte(`{"n":"x"}`)}, // undecodable
		{"m-4", "Typed", []byte("not json")},
		{"m-5", "Unknown", []byte(`{}`)},
		{"m-6", "", []byte(`{}`)},
		{"", "Known", []byte(`{}`)},                     // no id
		{strings.Repeat("i", 1025), "Known", nil},       // over the inbox bound
		{strings.Repeat("i", 1024), "Known", nil},       // at the bound
		{"a\x00b", "Known", []byte(`{}`)},               // NUL: PostgreSQL cannot store it (processed before the inbound id check)
		{"\xff\xfe\x00\x01guid", "Known", []byte(`{}`)}, // raw GUID bytes
		{"m-1", "Known", []byte(`{}`)},                  // repeat
	} {
		f.Add(s.id, s.typ, s.body)
	}
	b, err := New(WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("fuzz", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.NoRetry()
			endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil }, endpoint.ForTypes("Known"))
			endpoint.Consumer(e, func(context.Context, *endpoint.Context[fuzzTyped]) error { return nil }, endpoint.AsMessageType("Typed"))
		})
	})))
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = b.Stop(ctx) })
	ep := b.endpoints[0]
	dead, err := b.mem.Subscriber().Subscribe(ctx, ep.ErrorQueue)
	if err != nil {
		f.Fatal(err)
	}
	h := b.handler(ep)
	f.Fuzz(func(t *testing.T, id, typ string, body []byte) {
		msg := message.NewMessage(id, body)
		if typ != "" {
			msg.Metadata.Set(wire.HeaderMessageType, typ)
		}
		msg.SetContext(ctx)
		before := b.Stats()
		if err := h(msg); err != nil {
			t.Fatalf("handler error %v", err)
		}
		after := b.Stats()
		select {
		case <-msg.Nacked():
			t.Fatalf("requeued (not terminal); stats %+v", after)
		default:
		}
		consumed := after.Consumed - before.Consumed
		dup := after.Duplicates - before.Duplicates
		dl := after.DeadLettered - before.DeadLettered
		if consumed+dup+dl != 1 || after.Requeued != before.Requeued {
			t.Fatalf("outcome consumed=%d duplicate=%d dead-lettered=%d requeued=%d; want exactly one terminal outcome",
				consumed, dup, dl, after.Requeued-before.Requeued)
		}
		if dl == 1 {
			select {
			case m := <-dead:
				m.Ack()
				if m.Metadata.Get(wire.HeaderFaultReason) == "" {
					t.Fatal("dead-lettered without a fault reason")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("dead-lettered, but nothing in the error queue")
			}
		}
		var v fuzzTyped
		badID := id == "" || len(id) > maxInboundIDLen
		storeBadID := strings.ContainsRune(id, 0) || !utf8.ValidString(id)
		// Ids and types are judged before the inbox, bodies after it: an
		// undecodable body under an id processed before is a duplicate.
		undecodable := typ == "Typed" && json.Unmarshal(body, &v) != nil
		wantDead := badID || (typ != "Known" && typ != "Typed") || (undecodable && dup == 0)
		switch {
		case wantDead && dl != 1:
			t.Fatalf("id %q type %q: processed (consumed=%d duplicate=%d); want dead-lettered", id, typ, consumed, dup)
		case storeBadID && dl != 1:
			t.Fatalf("id %q (NUL or invalid UTF-8) processed; want dead-lettered at once", id)
		case !wantDead && !storeBadID && dl == 1:
			t.Fatalf("id %q type %q: dead-lettered; want processed", id, typ)
		}
	})
}
