package bus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/transport/inproc"
)

type benchOrder struct {
	OrderID string  `json:"orderId"`
	Amount  float64 `json:"amount"`
	Pad     string  `json:"pad"`
}

func benchLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// BenchmarkEnvelope is the CPU cost PublishTx adds before the INSERT:
// serializing the message and resolving id, type and destination.
func BenchmarkEnvelope(b *testing.B) {
	bs, err := New(WithLogger(benchLog()))
	if err != nil {
		b.Fatal(err)
	}
	msg := benchOrder{OrderID: "o-1", Amount: 12.5, Pad: strings.Repeat("x", 200)}
	for _, tc := range []struct {
		name string
		h    Headers
	}{
		{"generated-id", nil},
		{"caller-headers", Headers{HeaderMessageID: "order-o-1", HeaderCorrelationID: "c-1", "tenant": "acme"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := bs.envelope("", msg, tc.h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// startEmbedded starts an embedded-default bus with one endpoint whose
// consumer writes nothing; done receives each consumed message id.
func startEmbedded(b *testing.B, mode endpoint.InboxMode, done chan<- string) *Bus {
	b.Helper()
	bs, err := New(WithLogger(benchLog()), WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("bench-orders", func(e *endpoint.Endpoint) {
			e.Inbox = mode
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[benchOrder]) error {
				if done != nil {
					done <- c.MessageID
				}
				return nil
			})
		})
	})))
	if err != nil {
		b.Fatal(err)
	}
	if err := bs.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := bs.Stop(ctx); err != nil {
			b.Error(err)
		}
	})
	return bs
}

var inboxModes = []struct {
	name string
	mode endpoint.InboxMode
}{{"InboxOff", endpoint.InboxOff}, {"InboxTwoPhase", endpoint.InboxTwoPhase}, {"InboxSingleTransaction", endpoint.InboxSingleTransaction}}

// BenchmarkHandlerDispatch is the consume side without the transport: the
// endpoint's handler (retry policy, inbox middleware, transaction, type
// dispatch, JSON decode, consumer) run directly on a message, on the
// embedded default's in-memory SQLite.
func BenchmarkHandlerDispatch(b *testing.B) {
	body := []byte(`{"orderId":"o-1","amount":12.5,"pad":"` + strings.Repeat("x", 200) + `"}`)
	for _, m := range inboxModes {
		b.Run(m.name, func(b *testing.B) {
			bs := startEmbedded(b, m.mode, nil)
			h := bs.handler(bs.endpoints[0])
			typ := endpoint.TypeNameOf[benchOrder]()
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				msg := message.NewMessage("m-"+strconv.Itoa(i), body)
				msg.Metadata.Set(wire.HeaderMessageType, typ)
				msg.Metadata.Set(wire.HeaderContentType, "application/json")
				msg.SetContext(context.Background())
				if err := h(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEmbeddedRoundTrip is one message at a time through the whole
// embedded pipeline: a transaction with PublishTx, the relay, the in-process
// transport, the inbox and the consumer. ns/op is the commit-to-consume
// latency of an otherwise idle embedded bus.
func BenchmarkEmbeddedRoundTrip(b *testing.B) {
	for _, m := range inboxModes {
		b.Run(m.name, func(b *testing.B) {
			done := make(chan string, 1)
			bs := startEmbedded(b, m.mode, done)
			ctx := context.Background()
			msg := benchOrder{OrderID: "o-1", Amount: 12.5, Pad: strings.Repeat("x", 200)}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				id := fmt.Sprintf("rt-%d", i)
				err := bs.Transaction(ctx, func(tx *gorm.DB) error {
					return bs.PublishTx(ctx, tx, msg, Headers{HeaderMessageID: id})
				})
				if err != nil {
					b.Fatal(err)
				}
				select {
				case got := <-done:
					if got != id {
						b.Fatalf("consumed %q, want %q", got, id)
					}
				case <-time.After(10 * time.Second):
					b.Fatal("message not consumed within 10s")
				}
			}
		})
	}
}

// BenchmarkHandlerDispatchConcurrent is BenchmarkHandlerDispatch with 32
// deliveries in flight at once (16 goroutines per CPU), as under load: on
// the two-phase inbox the deliveries waiting are group-committed.
func BenchmarkHandlerDispatchConcurrent(b *testing.B) {
	body := []byte(`{"orderId":"o-1","amount":12.5,"pad":"` + strings.Repeat("x", 200) + `"}`)
	for _, m := range inboxModes {
		b.Run(m.name, func(b *testing.B) {
			bs := startEmbedded(b, m.mode, nil)
			h := bs.handler(bs.endpoints[0])
			typ := endpoint.TypeNameOf[benchOrder]()
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					msg := message.NewMessage("m-"+strconv.FormatInt(n.Add(1), 10), body)
					msg.Metadata.Set(wire.HeaderMessageType, typ)
					msg.Metadata.Set(wire.HeaderContentType, "application/json")
					msg.SetContext(context.Background())
					if err := h(msg); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
