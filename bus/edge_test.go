package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// TestPublishRefusesWhatTransportsCannotCarry: every publish call refuses,
// naming the field and the limit, what a transport or the outbox table
// could not carry, and writes nothing.
func TestPublishRefusesWhatTransportsCannotCarry(t *testing.T) {
	t.Parallel()
	b := start(t, quiet(), inprocEndpoint("edge-orders", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(context.Context, *endpoint.Context[PaymentReceived]) error { return nil })
	}))
	ctx := context.Background()
	long := strings.Repeat("x", 300)
	calls := map[string]func(h bus.Headers) error{
		"Publish": func(h bus.Headers) error { return b.Publish(ctx, PaymentReceived{}, h) },
		"Send":    func(h bus.Headers) error { return b.Send(ctx, "edge-orders", PaymentReceived{}, h) },
		"PublishTx": func(h bus.Headers) error {
			return b.Transaction(ctx, func(tx *gorm.DB) error { return b.PublishTx(ctx, tx, PaymentReceived{}, h) })
		},
		"SendTx": func(h bus.Headers) error {
			return b.Transaction(ctx, func(tx *gorm.DB) error { return b.SendTx(ctx, tx, "edge-orders", PaymentReceived{}, h) })
		},
	}
	for _, tc := range []struct {
		name string
		h    bus.Headers
		want string
	}{
		{"correlation id over 255", bus.Headers{bus.HeaderCorrelationID: long}, "correlation id is 300 bytes; at most 255"},
		{"type over 255", bus.Headers{bus.HeaderMessageType: long}, "message type is 300 bytes; at most 255"},
		{"content type over 255", bus.Headers{bus.HeaderContentType: long}, "content type is 300 bytes; at most 255"},
		{"routing key over 255", bus.Headers{bus.HeaderRoutingKey: long}, "routing key is 300 bytes; at most 255"},
		{"header key over 255", bus.Headers{long: "v"}, "header key is 300 bytes; at most 255"},
		{"id over 200", bus.Headers{bus.HeaderMessageID: long[:201]}, "message id is 201 bytes; at most 200"},
		{"NUL in id", bus.Headers{bus.HeaderMessageID: "a\x00"}, "message id contains a NUL byte"},
		{"raw GUID bytes as id", bus.Headers{bus.HeaderMessageID: "\x9f\x12\xfe\x00\x01"}, "message id"},
		{"invalid UTF-8 correlation id", bus.Headers{bus.HeaderCorrelationID: "\xff"}, "correlation id is not valid UTF-8"},
		{"NUL in header value", bus.Headers{"tenant": "a\x00b"}, `header "tenant" contains a NUL byte`},
		{"invalid UTF-8 header key", bus.Headers{"\xfe": "v"}, "header key is not valid UTF-8"},
		{"headers over 64 KiB", bus.Headers{"big": strings.Repeat("v", 70_000)}, "headers take"},
	} {
		for name, call := range calls {
			err := call(tc.h)
			if !errors.Is(err, bus.ErrInvalidMessage) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s %s: %v; want ErrInvalidMessage naming %q", name, tc.name, err, tc.want)
			}
		}
	}
	if err := b.Send(ctx, "exchange:"+long, PaymentReceived{}, nil); !errors.Is(err, bus.ErrInvalidMessage) || !strings.Contains(err.Error(), "exchange name is 300 bytes") {
		t.Errorf("Send to a 300-byte exchange: %v", err)
	}
	if err := b.Send(ctx, "queue:"+long, PaymentReceived{}, nil); !errors.Is(err, bus.ErrInvalidMessage) || !strings.Contains(err.Error(), "queue name is 300 bytes") {
		t.Errorf("Send to a 300-byte queue: %v", err)
	}
	st, err := b.OutboxStore().Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending+st.Parked+deliveredRows(t, b.OutboxStore()) != 0 {
		t.Errorf("refused publishes wrote outbox rows: %+v", st)
	}
	// The limits themselves are accepted.
	if err := b.Publish(ctx, PaymentReceived{}, bus.Headers{bus.HeaderCorrelationID: long[:255], bus.HeaderMessageID: long[:200]}); err != nil {
		t.Errorf("publish at the limits: %v", err)
	}
}

// TestInheritedCorrelationIDThatCannotBeCarriedIsDropped: a received
// message whose correlation id a publish would refuse (a foreign producer
// put it there) must not make the consumer's follow-up publish fail, and so
// the consumer fail forever; the follow-up goes out without it.
func TestInheritedCorrelationIDThatCannotBeCarriedIsDropped(t *testing.T) {
	t.Parallel()
	followed := make(chan string, 1)
	failed := make(chan error, 10)
	b := start(t, quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("inherit-in", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.RetryPolicy{Kind: endpoint.RetryNone}
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PaymentReceived]) error {
				err := c.Publish(ctx, RefundIssued{PaymentID: "r"}, nil)
				if err != nil {
					failed <- err
				}
				return err
			})
		})
		c.ReceiveEndpoint("inherit-out", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[RefundIssued]) error {
				followed <- c.CorrelationID
				return nil
			})
		})
	}))
	err := bus.DeliverForTest(b, &outbox.Message{MessageID: "inherit-1", Destination: "queue:inherit-in",
		MessageType: endpoint.TypeName(PaymentReceived{}), ContentType: "application/json",
		CorrelationID: strings.Repeat("c", 300), Payload: []byte(`{"paymentId":"p"}`)})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-followed:
		if c != "" {
			t.Errorf("follow-up inherited correlation id %q; want none", c)
		}
	case err := <-failed:
		t.Fatalf("the consumer's follow-up publish failed over the inherited correlation id: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no follow-up message")
	}
}

// TestInProcessRefusesRabbitMQOnlySettings: the in-process transport has
// no queue arguments and routes every message of an exchange to each bound
// queue, so an endpoint that sets Endpoint.Queue (a dead-letter exchange, a
// quorum type, a TTL, ...) or binds with a routing key, arguments or to an
// exchange is refused by bus.New, naming the endpoint, instead of having
// its settings silently ignored. (On RabbitMQ, the dead-letter exchange is
// TestRabbitDeadLetterExchangeUnroutableFallsBackToErrorQueue's.)
func TestInProcessRefusesRabbitMQOnlySettings(t *testing.T) {
	t.Parallel()
	consumer := func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(context.Context, *endpoint.Context[PaymentReceived]) error { return nil })
	}
	for name, configure := range map[string]func(e *endpoint.Endpoint){
		"dead-letter exchange": func(e *endpoint.Endpoint) { e.Queue.DeadLetterExchange = "dlx-nowhere" },
		"quorum queue":         func(e *endpoint.Endpoint) { e.Queue.Type = endpoint.Quorum },
		"message TTL":          func(e *endpoint.Endpoint) { e.Queue.MessageTTL = time.Minute },
		"queue arguments":      func(e *endpoint.Endpoint) { e.Queue.Args = map[string]any{"x-delivery-limit": 5} },
		"routing key":          func(e *endpoint.Endpoint) { e.Bind("orders", "eu.*") },
		"binding arguments": func(e *endpoint.Endpoint) {
			e.Bindings = append(e.Bindings, endpoint.Binding{Exchange: "orders", Queue: e.Name(), Args: map[string]any{"x-match": "all"}})
		},
		"exchange to exchange": func(e *endpoint.Endpoint) {
			e.Bindings = append(e.Bindings, endpoint.Binding{Exchange: "orders", ToExchange: "orders-eu"})
		},
	} {
		_, err := bus.New(quiet(), inprocEndpoint("refused", func(e *endpoint.Endpoint) {
			configure(e)
			consumer(e)
		}))
		if !errors.Is(err, bus.ErrInvalidOption) || !strings.Contains(err.Error(), `inproc: endpoint "refused"`) {
			t.Errorf("%s: New = %v; want ErrInvalidOption naming the endpoint", name, err)
		}
	}
	// A plain binding (exchange to the endpoint's queue) is the
	// in-process transport's own routing: accepted.
	if _, err := bus.New(quiet(), inprocEndpoint("plain", func(e *endpoint.Endpoint) {
		e.Bind("orders", "")
		consumer(e)
	})); err != nil {
		t.Errorf("plain binding: %v", err)
	}
}
