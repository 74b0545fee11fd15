package saga_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/inproc"
)

// snippet:start example-types
// Ticket is the instance: saga.State plus its own data.
type Ticket struct {
	saga.State
	Assignee string
}

type TicketOpened struct{ TicketID string }
type TicketAssigned struct{ TicketID, To string }
type TicketClosed struct{ TicketID string }

// snippet:end example-types

func Example() {
	// snippet:start example
	m, err := saga.New("tickets", func(m *saga.Machine[Ticket]) {
		open := m.State("Open")
		assigned := m.State("Assigned")

		opened := saga.NewEvent(m, func(e TicketOpened) string { return e.TicketID })
		assign := saga.NewEvent(m, func(e TicketAssigned) string { return e.TicketID })
		closed := saga.NewEvent(m, func(e TicketClosed) string { return e.TicketID })

		m.Initially(saga.When(opened).TransitionTo(open))
		m.During(open,
			saga.When(assign).
				Where(func(c *saga.Context[Ticket, TicketAssigned]) bool { return c.Message.To != "" }).
				Then(func(ctx context.Context, c *saga.Context[Ticket, TicketAssigned]) error {
					c.Instance.Assignee = c.Message.To
					return nil
				}).
				TransitionTo(assigned))
		m.DuringAny(saga.When(closed).Finalize())
	}, saga.KeepFinalized())
	if err != nil {
		panic(err)
	}
	b, err := bus.New(bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("tickets", func(e *endpoint.Endpoint) { saga.Register(e, m) })
	})), bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		panic(err)
	}
	defer b.Stop(ctx)
	if err := saga.Migrate(ctx, b.DB(), m); err != nil {
		panic(err)
	}
	// snippet:end example

	step := func(msg any, state string) *Ticket {
		if err := b.Publish(ctx, msg, nil); err != nil {
			panic(err)
		}
		for { // the instance's state is the signal: poll it
			if t, err := m.Get(ctx, b.DB(), "T-1"); err == nil && t.CurrentState == state {
				return t
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	step(TicketOpened{TicketID: "T-1"}, "Open")
	t := step(TicketAssigned{TicketID: "T-1", To: "ada"}, "Assigned")
	fmt.Println(t.CurrentState, t.Assignee, t.Version)
	t = step(TicketClosed{TicketID: "T-1"}, "Final")
	fmt.Println(t.CurrentState, t.Version)
	// Output:
	// Assigned ada 2
	// Final 3
}
