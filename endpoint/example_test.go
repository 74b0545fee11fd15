package endpoint_test

// The examples in this file are the source of the code blocks in docs/.
// Those with an "// Output:" comment run with `go test`: on the embedded
// default, or building a bus on RabbitMQ, which connects to nothing until
// Start. Edit them here, then run `go run ./internal/tools/docsnippets -fix`.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// run builds a bus on the embedded default from opts, starts it, calls fn
// and stops the bus.
func run(opts []bus.Option, fn func(ctx context.Context, b *bus.Bus)) {
	ctx := context.Background()
	quiet := bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	b, err := bus.New(append([]bus.Option{quiet}, opts...)...)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer b.Stop(ctx)
	fn(ctx, b)
}

// eventually polls cond for up to 10s.
func eventually(cond func() bool) {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			log.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ShipmentDispatched is the message of most examples here.
type ShipmentDispatched struct {
	ShipmentID string `json:"shipmentId"`
	Carrier    string `json:"carrier"`
}

// ShipmentDelivered is a second message type.
type ShipmentDelivered struct {
	ShipmentID string `json:"shipmentId"`
}

func ExampleConsumer() {
	done := make(chan struct{})
	// snippet:start consumer-func
	notify := func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
		// c.Message is decoded; c.Delivery has the id, headers and raw body.
		fmt.Printf("%s by %s (message %s, attempt %d)\n", c.Message.ShipmentID, c.Message.Carrier, c.MessageID, c.Attempt)
		close(done)
		return nil
	}
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("shipment-notifications", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, notify) // T inferred: ShipmentDispatched
		})
	}))}
	// snippet:end consumer-func
	run(opts, func(ctx context.Context, b *bus.Bus) {
		if err := b.Publish(ctx, ShipmentDispatched{ShipmentID: "s-1", Carrier: "DHL"}, bus.Headers{bus.HeaderMessageID: "m-1"}); err != nil {
			log.Fatal(err)
		}
		<-done
	})
	// Output: s-1 by DHL (message m-1, attempt 1)
}

// snippet:start consumer-struct
// Notifier is a consumer with dependencies. It implements
// endpoint.Handler[ShipmentDispatched].
type Notifier struct {
	Mailer interface{ Send(to, text string) error }
}

func (n *Notifier) Consume(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
	return n.Mailer.Send("customer@example.com", "Shipment "+c.Message.ShipmentID+" is on its way")
}

// snippet:end consumer-struct

type printMailer struct{ done chan struct{} }

func (m printMailer) Send(to, text string) error {
	fmt.Println("to", to+":", text)
	close(m.done)
	return nil
}

func ExampleConsumerOf() {
	mailer := printMailer{done: make(chan struct{})}
	// snippet:start consumer-struct-register
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("shipment-notifications", func(e *endpoint.Endpoint) {
			endpoint.ConsumerOf[ShipmentDispatched](e, &Notifier{Mailer: mailer})
		})
	}))}
	// snippet:end consumer-struct-register
	run(opts, func(ctx context.Context, b *bus.Bus) {
		if err := b.Publish(ctx, ShipmentDispatched{ShipmentID: "s-2"}, nil); err != nil {
			log.Fatal(err)
		}
		<-mailer.done
	})
	// Output: to customer@example.com: Shipment s-2 is on its way
}

func ExampleRawConsumer() {
	var mu sync.Mutex
	var got []string
	record := func(s string) { mu.Lock(); got = append(got, s); mu.Unlock() }
	// snippet:start raw-consumer
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("shipments", func(e *endpoint.Endpoint) {
			// Typed: ShipmentDispatched messages, decoded.
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
				record("typed " + c.MessageType)
				return nil
			})
			// Raw, bound to a type: ShipmentDelivered messages, as bytes.
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				record("raw " + d.MessageType + " " + string(d.Body))
				return nil
			}, endpoint.ForTypes("ShipmentDelivered"))
			// Raw catch-all: every other type sent to the queue, and messages
			// without a type.
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				record("catch-all " + d.MessageType)
				return nil
			})
		})
	}))}
	// snippet:end raw-consumer
	run(opts, func(ctx context.Context, b *bus.Bus) {
		must := func(err error) {
			if err != nil {
				log.Fatal(err)
			}
		}
		must(b.Publish(ctx, ShipmentDispatched{ShipmentID: "s-3"}, nil))
		must(b.Publish(ctx, ShipmentDelivered{ShipmentID: "s-3"}, nil))
		// A type nobody declared reaches the queue only when sent to it.
		must(b.Send(ctx, "shipments", bus.Raw{Type: "ShipmentLost", Body: []byte("{}")}, nil))
		eventually(func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 })
	})
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got)
	fmt.Println(strings.Join(got, "\n"))
	// Output:
	// catch-all ShipmentLost
	// raw ShipmentDelivered {"shipmentId":"s-3"}
	// typed ShipmentDispatched
}

// snippet:start type-namer
// CustomerRegistered chooses its wire name (BW-MessageType, and the
// exchange it is published to) instead of its Go type name.
type CustomerRegistered struct {
	CustomerID string `json:"customerId"`
}

func (CustomerRegistered) MessageType() string { return "crm.CustomerRegistered" }

// snippet:end type-namer

func ExampleTypeNamer() {
	done := make(chan string, 2)
	// snippet:start as-message-type
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("crm-sync", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[CustomerRegistered]) error {
				done <- c.MessageType
				return nil
			})
			// A message type published by another service under a name that
			// is not the Go type's: dispatch on that name instead.
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
				done <- c.MessageType
				return nil
			}, endpoint.AsMessageType("Logistics.ShipmentSent"))
		})
	}))}
	// snippet:end as-message-type
	run(opts, func(ctx context.Context, b *bus.Bus) {
		if err := b.Publish(ctx, CustomerRegistered{CustomerID: "c-1"}, nil); err != nil {
			log.Fatal(err)
		}
		fmt.Println(<-done)
		err := b.Publish(ctx, ShipmentDispatched{ShipmentID: "s-4"}, bus.Headers{bus.HeaderMessageType: "Logistics.ShipmentSent"})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(<-done)
	})
	// Output:
	// crm.CustomerRegistered
	// Logistics.ShipmentSent
}

func ExampleNamed() {
	var mu sync.Mutex
	var calls []string
	call := func(s string) { mu.Lock(); calls = append(calls, s); mu.Unlock() }
	// snippet:start named
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.NoRetry()
			// Two consumers of one type on one endpoint run in registration
			// order, in one transaction, under one inbox entry: both commit, or
			// neither does and the message is retried or dead-lettered as a whole.
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
				call("tracking")
				return nil
			}, endpoint.Named("tracking"))
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
				call("invoicing")
				return errors.New("invoicing failed") // rolls back tracking's writes too
			}, endpoint.Named("invoicing"))
		})
	}))}
	// snippet:end named
	run(opts, func(ctx context.Context, b *bus.Bus) {
		if err := b.Publish(ctx, ShipmentDispatched{ShipmentID: "s-5"}, nil); err != nil {
			log.Fatal(err)
		}
		eventually(func() bool { return b.Stats().DeadLettered == 1 })
	})
	fmt.Println(strings.Join(calls, ", "))
	// Output: tracking, invoicing
}

// Example_endpointFields sets every field of an endpoint, on RabbitMQ (the
// one transport with queue settings). bus.New connects to nothing: it only
// checks the declarations.
func Example_endpointFields() {
	handle := func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error { return nil }
	amqpURL := "amqp://guest:guest@127.0.0.1:5672/"
	// snippet:start config-endpoint
	opts := []bus.Option{bus.WithTransport(rabbitmq.New(amqpURL, func(c *rabbitmq.Config) {
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, handle)
			e.PrefetchCount = 32                                                   // default ConcurrentMessageLimit
			e.ConcurrentMessageLimit = 16                                          // default 8; at most PrefetchCount
			e.Retry = endpoint.Exponential(5, 200*time.Millisecond, 5*time.Second) // default Exponential(3, 100ms, 2s)
			e.Redelivery = []time.Duration{time.Minute, 10 * time.Minute}          // default none
			e.Serializer = endpoint.JSON                                           // default JSON
			e.Inbox = endpoint.InboxTwoPhase                                       // default; or InboxSingleTransaction, InboxOff
			e.Batch.MaxMessages = 32                                               // group commit: default 32; 1 turns it off
			e.Batch.MaxDuration = 100 * time.Millisecond                           // default 100ms
			e.MissingMessageID = endpoint.RejectMissingID                          // default; or ProcessMissingID
			e.HandlerTimeout = 30 * time.Second                                    // default 0: none
			e.ErrorQueue = "shipping_error"                                        // default "<name>_error"
			e.Queue.Type = endpoint.Quorum                                         // RabbitMQ queue settings; see docs/topology.md
			e.Bind("legacy-shipping", "")                                          // extra binding of this queue
		})
	}))}
	// snippet:end config-endpoint
	_, err := bus.New(opts...)
	fmt.Println(err)
	// Output: <nil>
}

// Example_retryPolicies lists the retry policies. It only builds them.
func Example_retryPolicies() {
	var e endpoint.Endpoint
	// snippet:start retry-policies
	e.Retry = endpoint.NoRetry()                                                  // 1 attempt, then dead-letter
	e.Retry = endpoint.Immediate(3)                                               // 4 attempts, no wait
	e.Retry = endpoint.Interval(3, 500*time.Millisecond)                          // wait 500ms each time
	e.Retry = endpoint.Incremental(4, 100*time.Millisecond, 200*time.Millisecond) // 100ms, 300ms, 500ms, 700ms
	e.Retry = endpoint.Exponential(5, 100*time.Millisecond, 10*time.Second)       // ~100ms, ~200ms, ~400ms ... up to 10s, each ±20%
	// snippet:end retry-policies
	fmt.Println(e.Retry.Kind == endpoint.RetryExponential, e.Retry.Retries, e.Retry.Multiplier, e.Retry.RandomizationFactor)
	// Output: true 5 2 0.2
}

// snippet:start should-retry
// ErrInvalidAddress is a failure no retry can fix.
var ErrInvalidAddress = errors.New("invalid address")

func shipWithRetryFilter(e *endpoint.Endpoint) {
	e.Retry = endpoint.Interval(3, 100*time.Millisecond)
	// Retry only what may succeed later; dead-letter the rest at once.
	e.Retry.ShouldRetry = func(err error) bool { return !errors.Is(err, ErrInvalidAddress) }
}

// snippet:end should-retry

func ExampleRetryPolicy_shouldRetry() {
	var mu sync.Mutex
	attempts := map[string]int{}
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			shipWithRetryFilter(e)
			e.Retry.Interval = time.Millisecond // keep the example quick
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
				mu.Lock()
				attempts[c.Message.ShipmentID]++
				mu.Unlock()
				// snippet:start permanent
				switch c.Message.Carrier {
				case "":
					return ErrInvalidAddress // not retried: ShouldRetry says no
				case "nobody":
					return endpoint.Permanent(fmt.Errorf("carrier %q does not exist", c.Message.Carrier)) // never retried
				}
				return errors.New("carrier API timed out") // retried 3 times
				// snippet:end permanent
			})
		})
	}))}
	run(opts, func(ctx context.Context, b *bus.Bus) {
		for _, m := range []ShipmentDispatched{{ShipmentID: "no-address"}, {ShipmentID: "no-carrier", Carrier: "nobody"}, {ShipmentID: "timeout", Carrier: "DHL"}} {
			if err := b.Publish(ctx, m, nil); err != nil {
				log.Fatal(err)
			}
		}
		eventually(func() bool { return b.Stats().DeadLettered == 3 })
	})
	fmt.Println(attempts["no-address"], attempts["no-carrier"], attempts["timeout"])
	// Output: 1 1 4
}

func ExampleEndpoint_redelivery() {
	var mu sync.Mutex
	var calls []string
	done := make(chan struct{})
	// snippet:start redelivery
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1) // 2 attempts per delivery
			// Then through the outbox, to be delivered again after 10ms, then
			// after 50ms; only then dead-lettered.
			e.Redelivery = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond}
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error {
				n := c.Headers["BW-Redelivery-Count"] // "" on the first delivery
				mu.Lock()
				calls = append(calls, fmt.Sprintf("redelivery %q attempt %d", n, c.Attempt))
				mu.Unlock()
				if n != "2" {
					return errors.New("warehouse offline")
				}
				close(done)
				return nil
			})
		})
	}))}
	// snippet:end redelivery
	run(opts, func(ctx context.Context, b *bus.Bus) {
		if err := b.Publish(ctx, ShipmentDispatched{ShipmentID: "s-6"}, nil); err != nil {
			log.Fatal(err)
		}
		<-done
	})
	fmt.Println(strings.Join(calls, "\n"))
	// Output:
	// redelivery "" attempt 1
	// redelivery "" attempt 2
	// redelivery "1" attempt 1
	// redelivery "1" attempt 2
	// redelivery "2" attempt 1
}

// Example_inboxModes shows the per-endpoint inbox settings. It only
// declares endpoints.
func Example_inboxModes() {
	handle := func(ctx context.Context, c *endpoint.Context[ShipmentDispatched]) error { return nil }
	// snippet:start inbox-modes
	opts := []bus.Option{bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("shipping", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, handle) // InboxTwoPhase, RejectMissingID: the defaults
		})
		c.ReceiveEndpoint("shipping-metrics", func(e *endpoint.Endpoint) {
			e.Inbox = endpoint.InboxSingleTransaction // short handler: one commit per message
			endpoint.Consumer(e, handle)
		})
		c.ReceiveEndpoint("shipping-cache", func(e *endpoint.Endpoint) {
			e.Inbox = endpoint.InboxOff                    // idempotent by nature: no deduplication
			e.MissingMessageID = endpoint.ProcessMissingID // accept messages from producers that set no id
			endpoint.Consumer(e, handle)
		})
	}))}
	// snippet:end inbox-modes
	_, err := bus.New(opts...)
	fmt.Println(err)
	// Output: <nil>
}
