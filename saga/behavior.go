package saga

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
)

// Event is a message type that drives a machine, with the function that
// finds the instance it belongs to. Declare events with NewEvent.
type Event[S, M any] struct {
	m         *Machine[S]
	typ       string
	correlate func(M) string
}

// eventBinding is an event with its message type erased, for Register.
type eventBinding[S any] struct {
	register func(e *endpoint.Endpoint)
}

// NewEvent declares that messages of type M drive m; correlate returns the
// correlation id of the instance a message belongs to (a field of the
// message, typically). The message type name is endpoint.TypeNameOf[M];
// endpoint.AsMessageType among opts overrides it (a .NET service's type
// name, say). The consumer's name is always "saga:<machine>".
func NewEvent[S, M any](m *Machine[S], correlate func(msg M) string, opts ...endpoint.ConsumerOption) *Event[S, M] {
	r := &endpoint.Registration{MessageType: endpoint.TypeNameOf[M]()}
	var copts []endpoint.ConsumerOption
	for _, o := range opts {
		if o != nil {
			o(r)
			copts = append(copts, o)
		}
	}
	ev := &Event[S, M]{m: m, typ: r.MessageType, correlate: correlate}
	switch {
	case correlate == nil:
		m.fail("NewEvent[%s]: correlate function is nil", ev.typ)
		return ev
	case ev.typ == "":
		m.fail("NewEvent: message type %T has no name", *new(M))
		return ev
	}
	if _, dup := m.events[ev.typ]; dup {
		m.fail("event %s is declared twice", ev.typ)
		return ev
	}
	m.events[ev.typ] = eventBinding[S]{register: func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[M]) error {
			return m.handle(ctx, c.Delivery, ev.typ, c.Message, correlate(c.Message))
		}, append(copts, endpoint.AsMessageType(ev.typ), m.consumerName())...)
	}}
	return ev
}

// Name is the event's message type name.
func (e *Event[S, M]) Name() string { return e.typ }

// Context is what a behavior's steps receive: the event, its delivery, the
// instance (change its fields; the machine saves them) and the transaction
// everything happens in.
type Context[S, M any] struct {
	*endpoint.Delivery
	// Message is the event.
	Message M
	// Instance is the saga instance, loaded (or new) and saved by the machine.
	Instance *S
	// Tx is the consumer's transaction. Write anything that must change
	// together with the instance through it (a history table, say).
	Tx *gorm.DB
	// From is the state the instance was in when the event arrived.
	From StateName

	tr *transition[S]
}

// State returns the instance's saga state (its id, current state, version).
func (c *Context[S, M]) State() *State { return any(c.Instance).(stateHolder).SagaState() }

// Behavior is what a state does with one event: built with When or Ignore.
type Behavior[S any] interface {
	bind(m *Machine[S]) (*bound[S], error)
}

// bound is a behavior with its message type erased.
type bound[S any] struct {
	typ     string
	ignore  bool
	applies func(c *Context[S, any]) bool
	run     func(ctx context.Context, c *Context[S, any]) error
}

type step[S, M any] func(ctx context.Context, c *Context[S, M]) error

// EventBehavior is a behavior under construction: conditions and steps
// that run, in order, when the event arrives.
type EventBehavior[S, M any] struct {
	ev     *Event[S, M]
	ignore bool
	where  []func(c *Context[S, M]) bool
	steps  []step[S, M]
	errs   []error
}

// When starts a behavior for ev.
func When[S, M any](ev *Event[S, M]) *EventBehavior[S, M] { return &EventBehavior[S, M]{ev: ev} }

// Ignore is a behavior that accepts ev and does nothing, whatever the
// machine's unhandled policy (MassTransit's Ignore).
func Ignore[S, M any](ev *Event[S, M]) *EventBehavior[S, M] {
	return &EventBehavior[S, M]{ev: ev, ignore: true}
}

// Where adds a condition: the behavior runs only if every condition holds;
// otherwise the next behavior for the event is tried.
func (b *EventBehavior[S, M]) Where(cond func(c *Context[S, M]) bool) *EventBehavior[S, M] {
	if cond == nil {
		b.errs = append(b.errs, fmt.Errorf("When(%s).Where: condition is nil", b.name()))
		return b
	}
	b.where = append(b.where, cond)
	return b
}

// Then adds an activity: a function that changes the instance or writes
// through c.Tx. An error fails the event, and nothing of the transition
// (state, data, published messages) is kept.
func (b *EventBehavior[S, M]) Then(fn func(ctx context.Context, c *Context[S, M]) error) *EventBehavior[S, M] {
	if fn == nil {
		b.errs = append(b.errs, fmt.Errorf("When(%s).Then: function is nil", b.name()))
		return b
	}
	b.steps = append(b.steps, fn)
	return b
}

// Publish publishes the message msg returns (nil: nothing), through the
// outbox in the consumer's transaction: it leaves only if the transition
// commits.
func (b *EventBehavior[S, M]) Publish(msg func(c *Context[S, M]) any) *EventBehavior[S, M] {
	if msg == nil {
		b.errs = append(b.errs, fmt.Errorf("When(%s).Publish: function is nil", b.name()))
		return b
	}
	b.steps = append(b.steps, func(ctx context.Context, c *Context[S, M]) error {
		v := msg(c)
		if v == nil {
			return nil
		}
		return c.Publish(ctx, v, c.headers())
	})
	return b
}

// Send sends the message msg returns (nil: nothing) to destination
// ("queue:name", "exchange:name" or an endpoint name), through the outbox
// like Publish.
func (b *EventBehavior[S, M]) Send(destination string, msg func(c *Context[S, M]) any) *EventBehavior[S, M] {
	if msg == nil || destination == "" {
		b.errs = append(b.errs, fmt.Errorf("When(%s).Send(%q): destination and function are required", b.name(), destination))
		return b
	}
	b.steps = append(b.steps, func(ctx context.Context, c *Context[S, M]) error {
		v := msg(c)
		if v == nil {
			return nil
		}
		return c.Delivery.Send(ctx, destination, v, c.headers())
	})
	return b
}

// TransitionTo moves the instance to state; later steps see the new state.
func (b *EventBehavior[S, M]) TransitionTo(state StateName) *EventBehavior[S, M] {
	b.steps = append(b.steps, func(ctx context.Context, c *Context[S, M]) error {
		c.State().CurrentState = string(state)
		return nil
	})
	if state == Initial {
		b.errs = append(b.errs, fmt.Errorf("When(%s).TransitionTo(Initial): an instance cannot return to Initial", b.name()))
	}
	if b.ev != nil && b.ev.m != nil && !b.ev.m.states[state] {
		b.errs = append(b.errs, fmt.Errorf("When(%s).TransitionTo(%q): undeclared state; declare it with m.State", b.name(), state))
	}
	return b
}

// Finalize moves the instance to Final: the Finally activities run, and the
// row is deleted (or kept, with KeepFinalized).
func (b *EventBehavior[S, M]) Finalize() *EventBehavior[S, M] { return b.TransitionTo(Final) }

func (b *EventBehavior[S, M]) name() string {
	if b.ev == nil {
		return "nil event"
	}
	return b.ev.typ
}

func (b *EventBehavior[S, M]) bind(m *Machine[S]) (*bound[S], error) {
	if b.ev == nil {
		return nil, fmt.Errorf("When(nil): the event is nil")
	}
	if b.ev.m != m {
		return nil, fmt.Errorf("When(%s): the event belongs to another machine", b.ev.typ)
	}
	if len(b.errs) > 0 {
		return nil, b.errs[0]
	}
	typed := func(c *Context[S, any]) *Context[S, M] {
		return &Context[S, M]{Delivery: c.Delivery, Message: c.Message.(M), Instance: c.Instance, Tx: c.Tx, From: c.From, tr: c.tr}
	}
	return &bound[S]{
		typ:    b.ev.typ,
		ignore: b.ignore,
		applies: func(c *Context[S, any]) bool {
			tc := typed(c)
			for _, w := range b.where {
				if !w(tc) {
					return false
				}
			}
			return true
		},
		run: func(ctx context.Context, c *Context[S, any]) error {
			tc := typed(c)
			for _, s := range b.steps {
				if err := s(ctx, tc); err != nil {
					return err
				}
			}
			return nil
		},
	}, nil
}

// headers gives messages published from a transition the instance's
// correlation id when the event carried none.
func (c *Context[S, M]) headers() endpoint.Headers {
	if c.Delivery.CorrelationID != "" {
		return nil
	}
	return endpoint.Headers{"correlation-id": c.State().CorrelationID}
}
