//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/saga"
)

// The interaction profile's saga: billing starts one for some orders; it
// asks payments, which answers (after a seeded delay, or never) with Paid;
// then it asks shipping, which answers the same way with Shipped. A
// timeout, scheduled on entering each waiting state, ends it in TimedOut
// when the answer is late or never comes; Shipped ends it in Completed.
// Entering a terminal state writes one row to the sagadone table in the
// transition's transaction: the completion side effect the checker counts.

const (
	sagaTimeout          = 2 * time.Second
	sagaAwaitingPayment  = "AwaitingPayment"
	sagaAwaitingShipment = "AwaitingShipment"
	sagaCompleted        = "Completed"
	sagaTimedOut         = "TimedOut"
)

// ixSaga is the saga instance.
type ixSaga struct {
	saga.State
	PayMs        int    // payments answers after this long; -1: never
	ShipMs       int    // shipping answers after this long; -1: never
	TimeoutToken string `gorm:"size:64"`
}

type ixSagaStart struct {
	ID     string `json:"id"`
	PayMs  int    `json:"payMs"`
	ShipMs int    `json:"shipMs"`
}
type ixSagaPaid struct{ ID string }
type ixSagaShipped struct{ ID string }
type ixSagaTimeout struct{ ID string }

// ixAsk is what the saga sends to payments and to shipping: answer after
// Ms (-1: never).
type ixAsk struct {
	ID string `json:"id"`
	Ms int    `json:"ms"`
}

// sagaPlan draws what payments and shipping do with an order's saga: an
// answer well within the timeout, one after it, or none.
func sagaPlan(rng interface{ IntN(int) int }) int {
	switch r := rng.IntN(10); {
	case r < 6:
		return rng.IntN(600)
	case r < 8:
		return int(sagaTimeout/time.Millisecond) + 1000 + rng.IntN(1000)
	default:
		return -1
	}
}

// newMachine builds the saga's state machine, one registered on every
// instance (it holds no state of its own).
func (ix *interactions) newMachine() (*saga.Machine[ixSaga], error) {
	n := ix.names
	return saga.New("ix-"+ix.sfx, func(m *saga.Machine[ixSaga]) {
		awaitingPay := m.State(sagaAwaitingPayment)
		awaitingShip := m.State(sagaAwaitingShipment)
		completed := m.State(sagaCompleted)
		timedOut := m.State(sagaTimedOut)

		started := saga.NewEvent(m, func(e ixSagaStart) string { return e.ID }, endpoint.AsMessageType(n["SagaStart"]))
		paid := saga.NewEvent(m, func(e ixSagaPaid) string { return e.ID }, endpoint.AsMessageType(n["SagaPaid"]))
		shipped := saga.NewEvent(m, func(e ixSagaShipped) string { return e.ID }, endpoint.AsMessageType(n["SagaShipped"]))
		expired := saga.NewEvent(m, func(e ixSagaTimeout) string { return e.ID }, endpoint.AsMessageType(n["SagaTimeout"]))
		timeout := saga.NewSchedule(m, expired, func(s *ixSaga) *string { return &s.TimeoutToken }, sagaTimeout)

		m.Initially(saga.When(started).
			Then(func(ctx context.Context, c *saga.Context[ixSaga, ixSagaStart]) error {
				c.Instance.PayMs, c.Instance.ShipMs = c.Message.PayMs, c.Message.ShipMs
				return c.Send(ctx, "queue:"+n["payments"], ixAsk{ID: c.Message.ID, Ms: c.Message.PayMs},
					endpoint.Headers{bus.HeaderMessageType: n["PayRequest"]})
			}).
			Schedule(timeout, func(c *saga.Context[ixSaga, ixSagaStart]) any { return ixSagaTimeout{ID: c.Message.ID} }).
			TransitionTo(awaitingPay))
		m.During(awaitingPay,
			saga.When(paid).
				Then(func(ctx context.Context, c *saga.Context[ixSaga, ixSagaPaid]) error {
					return c.Send(ctx, "queue:"+n["shipping"], ixAsk{ID: c.Message.ID, Ms: c.Instance.ShipMs},
						endpoint.Headers{bus.HeaderMessageType: n["ShipRequest"]})
				}).
				Schedule(timeout, func(c *saga.Context[ixSaga, ixSagaPaid]) any { return ixSagaTimeout{ID: c.Message.ID} }).
				TransitionTo(awaitingShip),
			saga.When(expired).TransitionTo(timedOut).Then(sagaDone[ixSagaTimeout](ix)))
		m.During(awaitingShip,
			saga.When(shipped).TransitionTo(completed).Then(sagaDone[ixSagaShipped](ix)),
			saga.When(expired).TransitionTo(timedOut).Then(sagaDone[ixSagaTimeout](ix)))
		// A late answer meets a saga that timed out: accepted, no change.
		// Anything else (a second start, a second Shipped, a Paid after
		// Completed) is unhandled and dead-lettered, which the checker
		// counts as a problem. A start dead-lettered "in state X" after a
		// freeze is the bus's, not the saga's: the frozen delivery's inbox
		// lock was taken over and the message processed, and when it
		// resumed its transition met the instance, failed permanently and
		// was dead-lettered instead of being found a duplicate.
		m.During(timedOut, saga.Ignore(paid), saga.Ignore(shipped))
	}, saga.WithTable(ix.prefix+"sagas"))
}

// sagaDone records the saga's terminal state, in the transition's
// transaction: the completion side effect.
func sagaDone[M any](ix *interactions) func(context.Context, *saga.Context[ixSaga, M]) error {
	return func(ctx context.Context, c *saga.Context[ixSaga, M]) error {
		return c.Tx.Exec(`INSERT INTO `+ix.prefix+`sagadone (order_id, outcome, from_state) VALUES (?, ?, ?)`,
			c.State().CorrelationID, c.State().CurrentState, string(c.From)).Error
	}
}

// answer is the consumer of payments and shipping: it records its effect
// and answers the saga with reply after the asked delay, or never.
func answer[R any](ix *interactions, endpointName, effectPrefix, replyType, replyPrefix string, reply func(id string) R) func(context.Context, *endpoint.Context[ixAsk]) error {
	return func(ctx context.Context, c *endpoint.Context[ixAsk]) error {
		a := c.Message
		if err := ix.record(ctx, endpointName, effectPrefix+a.ID); err != nil {
			return err
		}
		if a.Ms < 0 {
			return nil
		}
		h := bus.Headers{bus.HeaderMessageType: replyType, bus.HeaderMessageID: replyPrefix + a.ID}
		if a.Ms > 0 {
			h = bus.Delay(time.Duration(a.Ms)*time.Millisecond, h)
		}
		return c.Send(ctx, "queue:"+ix.names["saga"], reply(a.ID), h)
	}
}

// checkSagas adds to problems what is wrong with the sagas of the
// committed orders, and returns the count of each terminal state (by the
// state it was left from).
func (ix *interactions) checkSagas(orders map[string]ixOrder, effects map[[2]string]int, problems []string) ([]string, map[string]int) {
	n := ix.names
	var rows []struct {
		CorrelationID, CurrentState string
	}
	if err := ix.db.Raw(`SELECT correlation_id, current_state FROM ` + ix.prefix + `sagas`).Scan(&rows).Error; err != nil {
		return append(problems, fmt.Sprintf("read the sagas: %v", err)), nil
	}
	state := map[string]string{}
	for _, r := range rows {
		state[r.CorrelationID] = r.CurrentState
	}
	var dones []struct {
		OrderID, Outcome, FromState string
		N                           int
	}
	if err := ix.db.Raw(`SELECT order_id, outcome, from_state, count(*) AS n FROM ` + ix.prefix + `sagadone GROUP BY order_id, outcome, from_state`).Scan(&dones).Error; err != nil {
		return append(problems, fmt.Sprintf("read the sagas' side effects: %v", err)), nil
	}
	type done struct {
		n             int
		outcome, from string
	}
	done1 := map[string]done{}
	for _, d := range dones {
		x := done1[d.OrderID]
		x.n += d.N
		x.outcome, x.from = d.Outcome, d.FromState
		done1[d.OrderID] = x
	}
	outcomes := map[string]int{}
	for id, o := range orders {
		if !o.Saga {
			if s, ok := state[id]; ok {
				problems = append(problems, fmt.Sprintf("saga %s exists (%s) but its order started none", id, s))
			}
			continue
		}
		s, ok := state[id]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("saga %s: never started", id))
			continue
		case s != sagaCompleted && s != sagaTimedOut:
			problems = append(problems, fmt.Sprintf("saga %s: still %s", id, s))
			continue
		}
		d := done1[id]
		switch {
		case d.n != 1:
			problems = append(problems, fmt.Sprintf("saga %s: %s with %d completion side effects, want 1", id, s, d.n))
			continue
		case d.outcome != s:
			problems = append(problems, fmt.Sprintf("saga %s: in %s, its side effect says %s", id, s, d.outcome))
			continue
		}
		outcomes[s+" from "+d.from]++
		if got := effects[[2]string{n["payments"], "pay-" + id}]; got != 1 {
			problems = append(problems, fmt.Sprintf("saga %s: payments asked %d times, want 1", id, got))
		}
		shipAsked := 0
		if d.from == sagaAwaitingShipment {
			shipAsked = 1 // the transition that sent it committed
		}
		if got := effects[[2]string{n["shipping"], "ship-" + id}]; got != shipAsked {
			problems = append(problems, fmt.Sprintf("saga %s: %s from %s, shipping asked %d times, want %d", id, s, d.from, got, shipAsked))
		}
		if (s == sagaCompleted && (o.PayMs < 0 || o.ShipMs < 0)) || (d.from == sagaAwaitingShipment && o.PayMs < 0) {
			problems = append(problems, fmt.Sprintf("saga %s: %s from %s, but payments (%d ms) or shipping (%d ms) never answers", id, s, d.from, o.PayMs, o.ShipMs))
		}
	}
	for id, s := range state {
		if _, ok := orders[id]; !ok {
			problems = append(problems, fmt.Sprintf("saga %s (%s) of an order that did not commit", id, s))
		}
	}
	for id := range done1 {
		if _, ok := state[id]; !ok {
			problems = append(problems, fmt.Sprintf("saga %s: a completion side effect without an instance", id))
		}
	}
	return problems, outcomes
}
