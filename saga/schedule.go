package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
)

// Schedule is a timeout of a machine (MassTransit's Schedule): an event of
// type M that a behavior sends to the machine's own endpoint, to arrive
// after a delay. Declare one with NewSchedule; schedule it from a behavior
// with EventBehavior.Schedule, cancel it with EventBehavior.Unschedule.
//
// The scheduled message's id is kept in a string field of the instance (the
// token, a column the model declares). The message is written to the outbox
// in the transition's transaction with bus.Delay, so it exists only if the
// transition commits. When it arrives, the machine compares its id with the
// token: a message whose id is not the token (cancelled, replaced by a
// later Schedule, or for an instance that is gone) is acknowledged and
// changes nothing, even if the cancel lost a race with the relay. A message
// that matches clears the token and is handled like any event, by the
// behaviors for M in the instance's state.
//
// A pending timeout is cancelled automatically when a transition moves the
// instance to another state (Final included) without scheduling it again,
// in that transition's transaction: a timeout belongs to the state it was
// scheduled for.
type Schedule[S, M any] struct {
	ev  *Event[S, M]
	def *timeoutDef[S]
}

// timeoutDef is a schedule with its message type erased.
type timeoutDef[S any] struct {
	name  string // the event's message type
	token func(*S) *string
	delay time.Duration
	is    func(v any) bool // v is the schedule's message type
}

// Timeout is a Schedule of any message type, as behaviors take it.
type Timeout[S any] interface {
	timeout() *timeoutDef[S]
}

func (s *Schedule[S, M]) timeout() *timeoutDef[S] {
	if s == nil {
		return nil
	}
	return s.def
}

// Event is the schedule's event: add behaviors for it with When, in the
// states the timeout may arrive in.
func (s *Schedule[S, M]) Event() *Event[S, M] { return s.ev }

// Delay is how long after the transition that schedules it the message is due.
func (s *Schedule[S, M]) Delay() time.Duration { return s.def.delay }

// NewSchedule declares ev as a timeout of m, due delay (1ms up to
// bus.MaxScheduleDelay) after a behavior schedules it. token returns the
// instance's field that holds the pending message's id (a string column of
// the model; empty when nothing is pending); each schedule needs a field
// of its own. ev's correlate function must find the instance from the
// message the behavior builds, as for any event.
func NewSchedule[S, M any](m *Machine[S], ev *Event[S, M], token func(inst *S) *string, delay time.Duration) *Schedule[S, M] {
	s := &Schedule[S, M]{ev: ev}
	switch {
	case ev == nil:
		m.fail("NewSchedule: the event is nil")
		return s
	case ev.m != m:
		m.fail("NewSchedule(%s): the event belongs to another machine", ev.typ)
		return s
	case token == nil:
		m.fail("NewSchedule(%s): the token function is nil; return a pointer to a string field of the instance", ev.typ)
		return s
	case delay < time.Millisecond || delay > bus.MaxScheduleDelay:
		m.fail("NewSchedule(%s): delay %v must be within 1ms-%v", ev.typ, delay, bus.MaxScheduleDelay)
		return s
	}
	if _, dup := m.timeouts[ev.typ]; dup {
		m.fail("NewSchedule(%s): the event is already a schedule", ev.typ)
		return s
	}
	if p := token(new(S)); p == nil {
		m.fail("NewSchedule(%s): the token function returned nil; return a pointer to a string field of the instance", ev.typ)
		return s
	}
	s.def = &timeoutDef[S]{name: ev.typ, token: token, delay: delay, is: func(v any) bool { _, ok := v.(M); return ok }}
	m.timeouts[ev.typ] = s.def
	return s
}

// transition is what the steps of one attempt at a transition share.
type transition[S any] struct {
	scheduled map[*timeoutDef[S]]bool // schedules set by this transition
}

// Schedule schedules t's message, built by msg (nil: nothing), to arrive at
// the machine's endpoint after t's delay: it is sent with bus.Delay through
// the outbox in the consumer's transaction, so it exists only if the
// transition commits. A timeout still pending on the instance is cancelled
// first (in the same transaction) and replaced: its token changes to the new
// message's id.
func (b *EventBehavior[S, M]) Schedule(t Timeout[S], msg func(c *Context[S, M]) any) *EventBehavior[S, M] {
	def := timeoutOf(t)
	if def == nil || msg == nil {
		b.errs = append(b.errs, fmt.Errorf("When(%s).Schedule: the schedule and the message function are required", b.name()))
		return b
	}
	b.steps = append(b.steps, func(ctx context.Context, c *Context[S, M]) error {
		v := msg(c)
		if v == nil {
			return nil
		}
		if !def.is(v) {
			return endpoint.Permanent(fmt.Errorf("saga: When(%s).Schedule(%s): the message function returned %T, not the schedule's event type", b.name(), def.name, v))
		}
		tok := def.token(c.Instance)
		if err := c.cancelTimeout(ctx, def, tok); err != nil {
			return err
		}
		id := bus.NewMessageID()
		h := c.headers()
		if h == nil {
			h = endpoint.Headers{}
		}
		h[bus.HeaderMessageID] = id
		h[bus.HeaderMessageType] = def.name
		if err := c.Delivery.Send(ctx, "queue:"+c.Delivery.Endpoint, v, bus.Delay(def.delay, h)); err != nil {
			return fmt.Errorf("saga: schedule %s: %w", def.name, err)
		}
		*tok = id
		if c.tr != nil {
			c.tr.scheduled[def] = true
		}
		return nil
	})
	return b
}

// Unschedule cancels t's pending message, if any, in the consumer's
// transaction and clears its token: if the transition commits, the message
// never arrives (or, if the relay sent it already, is ignored on arrival).
func (b *EventBehavior[S, M]) Unschedule(t Timeout[S]) *EventBehavior[S, M] {
	def := timeoutOf(t)
	if def == nil {
		b.errs = append(b.errs, fmt.Errorf("When(%s).Unschedule: the schedule is nil", b.name()))
		return b
	}
	b.steps = append(b.steps, func(ctx context.Context, c *Context[S, M]) error {
		if c.tr != nil {
			delete(c.tr.scheduled, def)
		}
		return c.cancelTimeout(ctx, def, def.token(c.Instance))
	})
	return b
}

// Respond answers the request that carried the event (one sent with
// bus.Request) with the message msg returns (nil: nothing), through the
// outbox in the consumer's transaction like Publish: the requester gets it
// only if the transition commits. An event that is not a request (it was
// published or sent) gets no response, and the transition goes on.
func (b *EventBehavior[S, M]) Respond(msg func(c *Context[S, M]) any) *EventBehavior[S, M] {
	if msg == nil {
		b.errs = append(b.errs, fmt.Errorf("When(%s).Respond: function is nil", b.name()))
		return b
	}
	b.steps = append(b.steps, func(ctx context.Context, c *Context[S, M]) error {
		v := msg(c)
		if v == nil {
			return nil
		}
		if err := c.Delivery.Respond(ctx, v); err != nil && !errors.Is(err, endpoint.ErrNotARequest) {
			return err
		}
		return nil
	})
	return b
}

func timeoutOf[S any](t Timeout[S]) *timeoutDef[S] {
	if t == nil {
		return nil
	}
	return t.timeout()
}

// cancelTimeout cancels the pending message *tok names, if any, and clears
// the token.
func (c *Context[S, M]) cancelTimeout(ctx context.Context, def *timeoutDef[S], tok *string) error {
	if *tok == "" {
		return nil
	}
	if _, err := c.Delivery.CancelScheduled(ctx, *tok); err != nil {
		return fmt.Errorf("saga: cancel timeout %s (message %s): %w", def.name, *tok, err)
	}
	*tok = ""
	return nil
}

// isStaleTimeout reports whether a delivery of a schedule's event is one
// the instance no longer waits for; a current one clears the token.
func (m *Machine[S]) isStaleTimeout(typ string, d *endpoint.Delivery, inst *S, exists bool) bool {
	def := m.timeouts[typ]
	if def == nil {
		return false
	}
	tok := def.token(inst)
	if !exists || *tok == "" || *tok != d.MessageID {
		return true
	}
	*tok = ""
	return false
}

// cancelLeftBehind cancels the timeouts still pending when a transition
// moved the instance to another state without scheduling them.
func (m *Machine[S]) cancelLeftBehind(ctx context.Context, c *Context[S, any]) error {
	for _, def := range m.timeouts {
		if c.tr.scheduled[def] {
			continue
		}
		if err := c.cancelTimeout(ctx, def, def.token(c.Instance)); err != nil {
			return err
		}
	}
	return nil
}
