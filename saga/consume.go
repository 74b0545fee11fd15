package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
)

// Register adds m's consumers to the receive endpoint e: one per event
// type, each named "saga:<machine>". Call it inside the endpoint's
// configure function. Every event is applied in the consumer's
// transaction, behind the endpoint's inbox: the instance, whatever the
// transition writes through Context.Tx and the messages it publishes commit
// together with the inbox's processed mark, or not at all.
func Register[S any](e *endpoint.Endpoint, m *Machine[S]) {
	if m == nil {
		// The endpoint's builder takes errors only from its own calls: a
		// nil consumer of a type named for the mistake makes bus.New
		// report "Consumer[saga.machineIsNil]: consumer function is nil".
		endpoint.Consumer[machineIsNil](e, nil)
		return
	}
	for _, ev := range m.events {
		ev.register(e)
	}
}

type machineIsNil struct{}

// savepoint is the name of the savepoint each attempt at a transition runs
// under; a conflict rolls back to it, which also discards the outbox rows
// the attempt wrote.
const savepoint = "barewire_saga"

// errConflict is one attempt's lost race; handle re-applies the event.
var errConflict = errors.New("conflict")

func (m *Machine[S]) handle(ctx context.Context, d *endpoint.Delivery, typ string, msg any, id string) error {
	switch {
	case id == "":
		return endpoint.Permanent(fmt.Errorf("saga %q: %s: correlate returned an empty correlation id", m.name, typ))
	case len(id) > MaxCorrelationIDLen:
		return endpoint.Permanent(fmt.Errorf("saga %q: %s: correlation id has %d bytes; the limit is %d", m.name, typ, len(id), MaxCorrelationIDLen))
	}
	tx := bus.TxFromContext(ctx)
	if tx == nil {
		return endpoint.Permanent(fmt.Errorf("saga %q: no transaction in the consumer's context; register the machine with saga.Register on a bus endpoint", m.name))
	}
	// One savepoint serves every attempt: ROLLBACK TO keeps it. It is not
	// released after a successful attempt (the commit releases it), which
	// saves a round trip per event.
	if err := tx.SavePoint(savepoint).Error; err != nil {
		return fmt.Errorf("saga %q: savepoint: %w", m.name, err)
	}
	for attempt := 0; ; attempt++ {
		err := m.apply(ctx, tx, d, typ, msg, id)
		if err == nil {
			return nil
		}
		if rerr := tx.RollbackTo(savepoint).Error; rerr != nil {
			return errors.Join(err, fmt.Errorf("saga %q: rollback to savepoint: %w", m.name, rerr))
		}
		if !errors.Is(err, errConflict) {
			return err
		}
		if attempt >= m.cfg.maxConflicts {
			return fmt.Errorf("%w: instance %q of %q changed under %s %d times in a row; the endpoint's retry policy runs it again", ErrConcurrencyConflict, id, m.name, typ, attempt+1)
		}
	}
}

// apply loads the instance, runs the event's behavior and saves the result;
// errConflict says another transaction changed (or created) the instance first.
func (m *Machine[S]) apply(ctx context.Context, tx *gorm.DB, d *endpoint.Delivery, typ string, msg any, id string) error {
	inst := new(S)
	st := any(inst).(stateHolder).SagaState()
	q := tx.Table(m.cfg.table)
	if m.cfg.pessimistic {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	exists := true
	if err := q.Where("correlation_id = ?", id).Take(inst).Error; errors.Is(err, gorm.ErrRecordNotFound) {
		exists = false
		st.CorrelationID, st.CurrentState = id, string(Initial)
	} else if err != nil {
		return fmt.Errorf("saga %q: load instance %q: %w", m.name, id, err)
	}
	from := StateName(st.CurrentState)
	version, created := st.Version, st.CreatedAt
	c := &Context[S, any]{Delivery: d, Message: msg, Instance: inst, Tx: tx, From: from,
		tr: &transition[S]{scheduled: map[*timeoutDef[S]]bool{}}}
	if m.isStaleTimeout(typ, d, inst, exists) {
		// A timeout the instance no longer waits for: cancelled or
		// replaced after the relay took it, or its instance is gone.
		return nil
	}

	b := m.pick(from, typ, c)
	if b == nil {
		if m.cfg.unhandled == IgnoreUnhandled {
			return nil
		}
		return endpoint.Permanent(&UnhandledError{Machine: m.name, Event: typ, State: from, CorrelationID: id, Exists: exists})
	}
	if b.ignore {
		return nil
	}
	if err := b.run(ctx, c); err != nil {
		return err
	}
	// The machine owns identity and version, whatever the steps did.
	st.CorrelationID, st.Version, st.CreatedAt = id, version, created
	to := StateName(st.CurrentState)
	if !m.states[to] || (to == Initial && from != Initial) {
		// A step set CurrentState itself: saving it would strand the
		// instance in a state no behavior handles.
		return endpoint.Permanent(fmt.Errorf("saga %q: %s moved instance %q from %q to %q, which is undeclared or Initial; move instances only with TransitionTo or Finalize", m.name, typ, id, from, to))
	}
	if to != from && len(m.timeouts) > 0 {
		if err := m.cancelLeftBehind(ctx, c); err != nil {
			return err
		}
	}
	if to == Final && from != Final {
		for _, fn := range m.final {
			if err := fn(ctx, c); err != nil {
				return err
			}
		}
		st.CurrentState = string(Final)
	}
	return m.save(tx, inst, st, exists, version)
}

// pick returns the first behavior for typ in state whose conditions hold:
// the state's own behaviors first, then DuringAny's.
func (m *Machine[S]) pick(state StateName, typ string, c *Context[S, any]) *bound[S] {
	lists := [][]*bound[S]{m.during[state]}
	if state != Initial && state != Final {
		lists = append(lists, m.any)
	}
	for _, l := range lists {
		for _, b := range l {
			if b.typ == typ && b.applies(c) {
				return b
			}
		}
	}
	return nil
}

func (m *Machine[S]) save(tx *gorm.DB, inst *S, st *State, exists bool, version int) error {
	now := time.Now().UTC()
	final := st.CurrentState == string(Final)
	switch {
	case !exists && final && !m.cfg.keep:
		// Started and finalized by one event: nothing to keep, but
		// another transaction may have created the instance meanwhile.
		var n int64
		if err := tx.Table(m.cfg.table).Where("correlation_id = ?", st.CorrelationID).Count(&n).Error; err != nil {
			return fmt.Errorf("saga %q: check instance %q: %w", m.name, st.CorrelationID, err)
		}
		if n > 0 {
			return errConflict
		}
		return nil
	case !exists:
		st.Version, st.CreatedAt, st.UpdatedAt = 1, now, now
		res := tx.Table(m.cfg.table).Clauses(clause.OnConflict{DoNothing: true}).Omit(clause.Associations).Create(inst)
		if res.Error != nil {
			return fmt.Errorf("saga %q: insert instance %q: %w", m.name, st.CorrelationID, res.Error)
		}
		if res.RowsAffected == 0 { // created concurrently: apply the event to that one
			return errConflict
		}
		return nil
	case final && !m.cfg.keep:
		res := tx.Table(m.cfg.table).Where("correlation_id = ? AND version = ?", st.CorrelationID, version).Delete(inst)
		if res.Error != nil {
			return fmt.Errorf("saga %q: delete finalized instance %q: %w", m.name, st.CorrelationID, res.Error)
		}
		if res.RowsAffected == 0 {
			return errConflict
		}
		return nil
	default:
		st.Version, st.UpdatedAt = version+1, now
		res := tx.Table(m.cfg.table).Model(inst).
			Where("correlation_id = ? AND version = ?", st.CorrelationID, version).
			Select("*").Omit("correlation_id", "created_at", clause.Associations).
			Updates(inst)
		if res.Error != nil {
			return fmt.Errorf("saga %q: update instance %q: %w", m.name, st.CorrelationID, res.Error)
		}
		if res.RowsAffected == 0 {
			return errConflict
		}
		return nil
	}
}
