// Command basic-publish-consume is the smallest BareWire program: one
// message type, one receive endpoint with a typed consumer, and Publish.
// POST /messages publishes a MessageSubmitted; the consumer on the
// basic-messages endpoint keeps what it received, which GET /received lists.
//
//	go run ./samples/basic-publish-consume -demo   # scripted run, prints and exits
//	go run ./samples/basic-publish-consume         # HTTP API on 127.0.0.1:8082
//
// Add -amqp-url and -postgres-dsn to run on RabbitMQ and PostgreSQL, or
// -transport postgres with -postgres-dsn to run on the PostgreSQL transport
// (no broker; see README.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// MessageSubmitted is the message published and consumed. Its wire name
// (BW-MessageType) is its Go type name, "MessageSubmitted".
type MessageSubmitted struct {
	Text string `json:"text"`
}

// Received is one message as the consumer saw it.
type Received struct {
	MessageID  string    `json:"messageId"`
	Text       string    `json:"text"`
	Endpoint   string    `json:"endpoint"`
	Attempt    int       `json:"attempt"`
	ReceivedAt time.Time `json:"receivedAt"`
}

// receivedLog is the consumer's side effect: an in-memory list. (To make
// an effect exactly once, write it through bus.TxFromContext(ctx) instead,
// as the transactional-outbox sample does.)
type receivedLog struct {
	mu   sync.Mutex
	msgs []Received
}

func (in *receivedLog) consume(_ context.Context, c *endpoint.Context[MessageSubmitted]) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.msgs = append(in.msgs, Received{
		MessageID: c.MessageID, Text: c.Message.Text, Endpoint: c.Endpoint, Attempt: c.Attempt, ReceivedAt: time.Now().UTC(),
	})
	return nil
}

func (in *receivedLog) list() []Received {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.msgs)
}

func main() {
	f := sample.ParseFlags("127.0.0.1:8082")
	in := &receivedLog{}
	// snippet:start declare
	declare := func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("basic-messages", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, in.consume) // func(ctx, *endpoint.Context[MessageSubmitted]) error
		})
	}
	// snippet:end declare
	b, err := f.NewBus(declare, nil)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /messages", func(w http.ResponseWriter, r *http.Request) {
		var m MessageSubmitted
		if err := sample.ReadJSON(w, r, &m); err != nil {
			sample.WriteError(w, http.StatusBadRequest, err)
			return
		}
		if v := r.URL.Query().Get("text"); v != "" {
			m.Text = v
		}
		if m.Text == "" {
			sample.WriteError(w, http.StatusBadRequest, errors.New(`text is required: ?text=hello or {"text":"hello"}`))
			return
		}
		id := r.URL.Query().Get("messageId")
		if id == "" {
			id = uuid.NewString()
		}
		// snippet:start publish
		if err := b.Publish(r.Context(), m, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			sample.WriteError(w, http.StatusServiceUnavailable, err)
			return
		}
		// snippet:end publish
		sample.WriteJSON(w, http.StatusAccepted, map[string]string{"messageId": id, "text": m.Text, "status": "published"})
	})
	mux.HandleFunc("GET /received", func(w http.ResponseWriter, r *http.Request) {
		msgs := in.list()
		sample.WriteJSON(w, http.StatusOK, map[string]any{"count": len(msgs), "received": msgs})
	})
	if err := f.Run(b, mux, func(ctx context.Context) error { return demo(ctx, b, in, f) }, 0); err != nil {
		log.Fatal(err)
	}
}

// demo publishes three messages and checks that each arrived once, intact,
// with the message-id it was published with.
func demo(ctx context.Context, b *bus.Bus, in *receivedLog, f sample.Flags) error {
	fmt.Printf("basic-publish-consume on %s\n\n", f.Transport())
	run := sample.RunID()
	sent := map[string]string{} // message-id → text
	for i, text := range []string{"hello", "from", "BareWire"} {
		id := fmt.Sprintf("basic-%s-%d", run, i+1)
		if err := b.Publish(ctx, MessageSubmitted{Text: text}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			return err
		}
		sent[id] = text
		fmt.Printf("published MessageSubmitted %-12q message-id %s\n", text, id)
	}
	mine := func() []Received {
		var out []Received
		for _, r := range in.list() {
			if _, ok := sent[r.MessageID]; ok {
				out = append(out, r)
			}
		}
		return out
	}
	if err := sample.WaitUntil(ctx, "the three messages", func() (bool, error) { return len(mine()) >= len(sent), nil }); err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond) // let a (wrong) duplicate show up
	got := mine()
	fmt.Printf("\nbasic-messages received %d message(s):\n", len(got))
	for _, r := range got {
		fmt.Printf("  %-18q message-id %s  attempt %d\n", r.Text, r.MessageID, r.Attempt)
	}
	fmt.Println()
	var c sample.Checks
	c.Expect(len(got) == len(sent), "received %d messages, one per publish (got %d)", len(sent), len(got))
	for _, r := range got {
		c.Expect(sent[r.MessageID] == r.Text, "message %s arrived with its text %q", r.MessageID, r.Text)
	}
	return c.Err()
}
