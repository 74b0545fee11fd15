package saga_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/inproc"
)

type Booking struct {
	saga.State
	Seats int
}

type BookSeats struct {
	BookingID string
	Seats     int
}

type BookingAnswer struct {
	BookingID string
	State     string
	Seats     int
}

// TestRespondAnswersARequestAfterTheTransition: a saga answers a request
// with the state the transition left, and a second request to the same
// instance sees the first one's effect; a transition that fails after
// Respond sends no answer (the caller gets the fault).
func TestRespondAnswersARequestAfterTheTransition(t *testing.T) {
	m, err := saga.New("bookings", func(m *saga.Machine[Booking]) {
		booked := m.State("Booked")
		book := saga.NewEvent(m, func(e BookSeats) string { return e.BookingID })
		answer := func(c *saga.Context[Booking, BookSeats]) any {
			return BookingAnswer{BookingID: c.Message.BookingID, State: c.State().CurrentState, Seats: c.Instance.Seats}
		}
		add := func(ctx context.Context, c *saga.Context[Booking, BookSeats]) error {
			c.Instance.Seats += c.Message.Seats
			return nil
		}
		failIfNegative := func(ctx context.Context, c *saga.Context[Booking, BookSeats]) error {
			if c.Message.Seats < 0 {
				return endpoint.Permanent(errors.New("negative seats"))
			}
			return nil
		}
		m.Initially(saga.When(book).Then(add).TransitionTo(booked).Respond(answer))
		m.During(booked, saga.When(book).Then(add).Respond(answer).Then(failIfNegative))
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.New(bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("bookings", func(e *endpoint.Endpoint) { saga.Register(e, m) })
	})), bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	if err := saga.Migrate(ctx, b.DB(), m); err != nil {
		t.Fatal(err)
	}
	a, err := bus.Request[BookingAnswer](ctx, b, "bookings", BookSeats{BookingID: "B-1", Seats: 2})
	if err != nil || a.State != "Booked" || a.Seats != 2 {
		t.Fatalf("first request: %+v, %v", a, err)
	}
	a, err = bus.Request[BookingAnswer](ctx, b, "bookings", BookSeats{BookingID: "B-1", Seats: 3})
	if err != nil || a.Seats != 5 {
		t.Fatalf("second request: %+v, %v", a, err)
	}
	_, err = bus.Request[BookingAnswer](ctx, b, "bookings", BookSeats{BookingID: "B-1", Seats: -1}, bus.WithRequestTimeout(10*time.Second))
	var fault *bus.RequestFaultError
	if !errors.As(err, &fault) {
		t.Fatalf("failing transition: %v, want a RequestFaultError (its Respond rolled back)", err)
	}
	if inst, err := m.Get(ctx, b.DB(), "B-1"); err != nil || inst.Seats != 5 {
		t.Fatalf("instance after the failed transition: %+v, %v", inst, err)
	}
}
