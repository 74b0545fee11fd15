// Command embedded-minimal is the smallest BareWire service on the embedded
// default: the in-process transport and in-memory SQLite, one endpoint,
// one Publish. It imports no transport package besides transport/inproc,
// so it links no broker client and no PostgreSQL driver; its test checks
// that, and measures what the embedded default costs.
//
//	go run ./examples/embedded-minimal
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/inproc"
)

// Greeting is the message published and consumed.
type Greeting struct {
	Text string `json:"text"`
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run publishes one Greeting and prints it as the consumer received it.
func run(ctx context.Context, out io.Writer) error {
	got := make(chan string, 1)
	b, err := bus.New(
		bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("greetings", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(_ context.Context, m *endpoint.Context[Greeting]) error {
					got <- m.Message.Text
					return nil
				})
			})
		})),
	)
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = b.Stop(context.Background()) }()
	if err := b.Publish(ctx, Greeting{Text: "hello"}, nil); err != nil {
		return err
	}
	select {
	case text := <-got:
		fmt.Fprintf(out, "greetings received %q\n", text)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the greeting: %w", ctx.Err())
	}
}
