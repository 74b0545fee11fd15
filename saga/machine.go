package saga

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"gorm.io/gorm/schema"

	"github.com/barewire-go/barewire/endpoint"
)

// State is the part of a saga instance the machine owns. Embed it in your
// own GORM model; the model's other fields are the instance's data:
//
//	type Order struct {
//		saga.State
//		Amount   float64
//		Attempts int
//	}
//
// The columns are correlation_id (primary key), current_state (indexed),
// version (optimistic concurrency), created_at and updated_at.
type State struct {
	CorrelationID string `gorm:"primaryKey;size:200" json:"correlationId"`
	CurrentState  string `gorm:"size:100;not null;index" json:"currentState"`
	Version       int    `gorm:"not null" json:"version"`
	// The machine sets both, in UTC (GORM's own time tracking is off for
	// them): DeleteFinalized compares updated_at with a UTC cutoff, and
	// SQLite compares timestamps as text.
	CreatedAt time.Time `gorm:"autoCreateTime:false" json:"createdAt"`
	UpdatedAt time.Time `gorm:"autoUpdateTime:false" json:"updatedAt"`
}

// SagaState returns s; a model that embeds State gets it promoted, which is
// how the machine finds the State inside the user's struct.
func (s *State) SagaState() *State { return s }

type stateHolder interface{ SagaState() *State }

// StateName names a state. Declare states with Machine.State.
type StateName string

// The two states every machine has. An instance that does not exist yet is
// in Initial; Finalize moves it to Final.
const (
	Initial StateName = "Initial"
	Final   StateName = "Final"
)

// UnhandledPolicy says what happens to an event that the instance's current
// state does not handle (no behavior for its type, or none whose Where
// holds), including an event for an instance that does not exist and that
// Initially does not handle.
type UnhandledPolicy int

const (
	// FaultUnhandled (the default) fails the message permanently: it is
	// dead-lettered at once, with a reason naming the machine, the event,
	// the state and the instance (the error wraps ErrUnhandledEvent).
	FaultUnhandled UnhandledPolicy = iota
	// IgnoreUnhandled acknowledges the message and changes nothing; the inbox still
	// records it as processed.
	IgnoreUnhandled
)

// Limits.
const (
	// MaxCorrelationIDLen is the longest correlation id (the primary key's size).
	MaxCorrelationIDLen = 200
	// MaxStateNameLen is the longest state name (the current_state column's size).
	MaxStateNameLen = 100
	// DefaultMaxConflictRetries is how often a transition is re-applied in
	// the same transaction after a concurrency conflict.
	DefaultMaxConflictRetries = 5
)

// Errors.
var (
	// ErrInvalidMachine is wrapped by every definition error New returns.
	ErrInvalidMachine = errors.New("saga: invalid machine")
	// ErrUnhandledEvent is wrapped by the permanent error of an event the
	// Fault policy rejects.
	ErrUnhandledEvent = errors.New("event not handled")
	// ErrConcurrencyConflict is returned, after the re-applies in the same
	// transaction are spent, when other transactions kept changing the
	// instance first. It is not permanent: the endpoint's retry policy
	// (and redelivery) runs the event again.
	ErrConcurrencyConflict = errors.New("saga: concurrency conflict")
	// ErrNotFound is returned by Get for an instance that does not exist.
	ErrNotFound = errors.New("saga: instance not found")
)

// Option configures a machine.
type Option func(*config)

type config struct {
	pessimistic  bool
	keep         bool
	retention    time.Duration
	unhandled    UnhandledPolicy
	maxConflicts int
	table        string
	errs         []error
}

// Pessimistic makes the machine lock the instance row (SELECT ... FOR
// UPDATE) before applying an event, instead of the default optimistic
// check on the version column. Concurrent events for one instance then
// wait for each other instead of conflicting and re-applying. SQLite has no
// row locks; there the database's single writer serializes transitions.
func Pessimistic() Option { return func(c *config) { c.pessimistic = true } }

// KeepFinalized keeps finalized instances as rows in state Final instead of
// deleting them (the default). Events for them then meet the unhandled
// policy rather than starting a new instance. Remove old ones with
// Machine.DeleteFinalized.
func KeepFinalized() Option { return func(c *config) { c.keep = true } }

// MaxRetention is the longest RetainFinalized period.
const MaxRetention = 10 * 365 * 24 * time.Hour

// RetainFinalized keeps finalized instances in Final (as KeepFinalized
// does) for period after their last change; Machine.RunCleanup then deletes
// them. period must be within 1s-10 years. Until it passes, events for a
// finalized instance meet the unhandled policy; after its row is deleted,
// an event Initially handles starts a new instance with the same id.
func RetainFinalized(period time.Duration) Option {
	return func(c *config) {
		if period < time.Second || period > MaxRetention {
			c.errs = append(c.errs, fmt.Errorf("%w: RetainFinalized(%v): the period must be within 1s-%v", ErrInvalidMachine, period, MaxRetention))
			return
		}
		c.keep, c.retention = true, period
	}
}

// OnUnhandled sets the policy for events a state does not handle.
// Defaults to FaultUnhandled.
func OnUnhandled(p UnhandledPolicy) Option {
	return func(c *config) {
		if p != FaultUnhandled && p != IgnoreUnhandled {
			c.errs = append(c.errs, fmt.Errorf("%w: OnUnhandled(%d): use saga.FaultUnhandled or saga.IgnoreUnhandled", ErrInvalidMachine, p))
			return
		}
		c.unhandled = p
	}
}

// MaxConflictRetries sets how many times a transition is re-applied in the
// same transaction after a concurrency conflict (0-100) before the event
// fails with ErrConcurrencyConflict. Defaults to 5.
func MaxConflictRetries(n int) Option {
	return func(c *config) {
		if n < 0 || n > 100 {
			c.errs = append(c.errs, fmt.Errorf("%w: MaxConflictRetries(%d): must be within 0-100", ErrInvalidMachine, n))
			return
		}
		c.maxConflicts = n
	}
}

// WithTable stores the instances in table instead of the model's GORM table name.
func WithTable(table string) Option {
	return func(c *config) {
		if table == "" || len(table) > 63 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithTable(%q): the table name must have 1-63 characters", ErrInvalidMachine, table))
			return
		}
		c.table = table
	}
}

// Machine is a state machine over instances of S, a GORM model that embeds
// State. Build one with New; register it on a receive endpoint with
// Register.
type Machine[S any] struct {
	name   string
	cfg    config
	states map[StateName]bool
	events map[string]eventBinding[S] // by message type
	during map[StateName][]*bound[S]
	any    []*bound[S]
	final  []func(ctx context.Context, c *Context[S, any]) error
	// timeouts are the schedules, by their event's message type.
	timeouts map[string]*timeoutDef[S]
	errs     []error
}

// Definition is what Migrate and tooling need of a machine, whatever its
// instance type.
type Definition interface {
	// Name is the machine's name.
	Name() string
	// Table is the table the instances are stored in.
	Table() string
	// Model returns a new, empty instance (a pointer to the model).
	Model() any
}

// New builds a machine named name: define declares its states, events and
// behaviors. New reports every definition mistake at once, joined, each
// wrapping ErrInvalidMachine.
func New[S any](name string, define func(m *Machine[S]), opts ...Option) (*Machine[S], error) {
	m := &Machine[S]{
		name:   name,
		cfg:    config{maxConflicts: DefaultMaxConflictRetries},
		states: map[StateName]bool{Initial: true, Final: true},
		events: map[string]eventBinding[S]{},
		during: map[StateName][]*bound[S]{},

		timeouts: map[string]*timeoutDef[S]{},
	}
	if name == "" || len(name) > 200 {
		m.fail("machine name %q: must have 1-200 characters", name)
	}
	if _, ok := any(new(S)).(stateHolder); !ok || reflect.TypeFor[S]().Kind() != reflect.Struct {
		m.fail("instance type %s must be a struct that embeds saga.State", reflect.TypeFor[S]())
	}
	for _, o := range opts {
		o(&m.cfg)
	}
	m.errs = append(m.errs, m.cfg.errs...)
	if define == nil {
		m.fail("define function is nil")
	} else if err := safeDefine(m, define); err != nil {
		m.errs = append(m.errs, err)
	}
	if len(m.events) == 0 && define != nil {
		m.fail("no events; declare one with saga.NewEvent(m, correlate)")
	}
	if m.cfg.table == "" && len(m.errs) == 0 {
		if t, err := tableName[S](); err != nil {
			m.fail("instance type %s: %v", reflect.TypeFor[S](), err)
		} else {
			m.cfg.table = t
		}
	}
	if len(m.errs) > 0 {
		return nil, errors.Join(m.errs...)
	}
	return m, nil
}

func safeDefine[S any](m *Machine[S], define func(*Machine[S])) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w %q: define function panicked: %v", ErrInvalidMachine, m.name, r)
		}
	}()
	define(m)
	return nil
}

func (m *Machine[S]) fail(format string, args ...any) {
	m.errs = append(m.errs, fmt.Errorf("%w %q: "+format, append([]any{ErrInvalidMachine, m.name}, args...)...))
}

// Name is the machine's name.
func (m *Machine[S]) Name() string { return m.name }

// Table is the table the instances are stored in.
func (m *Machine[S]) Table() string { return m.cfg.table }

// Retention is the RetainFinalized period; 0 if the option was not given.
func (m *Machine[S]) Retention() time.Duration { return m.cfg.retention }

// Model returns a new, empty *S.
func (m *Machine[S]) Model() any { return new(S) }

// State declares a state and returns its name. Initial and Final exist
// already.
func (m *Machine[S]) State(name string) StateName {
	s := StateName(name)
	switch {
	case name == "" || len(name) > MaxStateNameLen:
		m.fail("state %q: a state name must have 1-%d characters", name, MaxStateNameLen)
	case s == Initial || s == Final:
		m.fail("state %q is built in; use saga.%s", name, name)
	case m.states[s]:
		m.fail("state %q is declared twice", name)
	}
	m.states[s] = true
	return s
}

// Initially adds the behaviors for events that arrive when there is no
// instance (or it is still in Initial): the events that start a saga.
func (m *Machine[S]) Initially(behaviors ...Behavior[S]) { m.During(Initial, behaviors...) }

// During adds behaviors for events arriving while the instance is in state.
// For one event, the first behavior (in the order added) whose conditions
// hold runs.
func (m *Machine[S]) During(state StateName, behaviors ...Behavior[S]) {
	if !m.states[state] {
		m.fail("During(%q): undeclared state; declare it with m.State", state)
		return
	}
	if state == Final {
		m.fail("During(Final): a finalized instance handles no events; use Finally for what runs on finalizing")
		return
	}
	for _, b := range behaviors {
		if bb := m.bind(b); bb != nil {
			m.during[state] = append(m.during[state], bb)
		}
	}
}

// DuringAny adds behaviors for every state except Initial and Final. They
// are consulted after the current state's own behaviors.
func (m *Machine[S]) DuringAny(behaviors ...Behavior[S]) {
	for _, b := range behaviors {
		if bb := m.bind(b); bb != nil {
			m.any = append(m.any, bb)
		}
	}
}

// Finally adds an activity that runs when an instance enters Final, after
// the finalizing behavior's own steps and in the same transaction; c.Message
// is the event that finalized it.
func (m *Machine[S]) Finally(fn func(ctx context.Context, c *Context[S, any]) error) {
	if fn == nil {
		m.fail("Finally: function is nil")
		return
	}
	m.final = append(m.final, fn)
}

func (m *Machine[S]) bind(b Behavior[S]) *bound[S] {
	if b == nil || reflect.ValueOf(b).IsNil() {
		m.fail("a behavior is nil")
		return nil
	}
	bb, err := b.bind(m)
	if err != nil {
		m.fail("%v", err)
		return nil
	}
	return bb
}

// UnhandledError is the error of an event the FaultUnhandled policy rejects; it
// wraps ErrUnhandledEvent (and is wrapped with endpoint.Permanent).
type UnhandledError struct {
	Machine, Event, CorrelationID string
	State                         StateName
	Exists                        bool
}

func (e *UnhandledError) Error() string {
	if !e.Exists {
		return fmt.Sprintf("saga %q: %s: %s for instance %q: no instance exists and Initially does not handle it", e.Machine, ErrUnhandledEvent, e.Event, e.CorrelationID)
	}
	return fmt.Sprintf("saga %q: %s: %s in state %q (instance %q)", e.Machine, ErrUnhandledEvent, e.Event, e.State, e.CorrelationID)
}

func (e *UnhandledError) Unwrap() error { return ErrUnhandledEvent }

var _ Definition = (*Machine[struct{ State }])(nil)

// endpointConsumerName names the saga's consumers on an endpoint.
func (m *Machine[S]) consumerName() endpoint.ConsumerOption { return endpoint.Named("saga:" + m.name) }

// tableName is the GORM table name of S under the default naming strategy
// (or its TableName method).
func tableName[S any]() (string, error) {
	sch, err := schema.Parse(new(S), &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		return "", err
	}
	return sch.Table, nil
}
