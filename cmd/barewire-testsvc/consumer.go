package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/reliability/workload"
)

// errInjected is the failure the service injects into first attempts.
var errInjected = errors.New("testsvc: injected first-attempt failure")

// consumers holds the consumer role's handlers and counters.
type consumers struct {
	cfg *config
	// attempts counts handler runs that wrote an effect (committed or not).
	attempts atomic.Int64
	// injected counts injected first-attempt failures.
	injected atomic.Int64
}

// declare declares the three endpoints: ledger and notify consume orders,
// each writing one effect row and publishing one follow-up through the
// outbox; audit consumes the follow-ups, writing one row each.
func (cs *consumers) declare(e *endpoint.Endpoints) {
	n := cs.cfg.Names
	configure := func(ep *endpoint.Endpoint) {
		ep.ConcurrentMessageLimit = cs.cfg.Concurrency // PrefetchCount: the default, one per handler
		if cs.cfg.Retries == 0 {
			ep.Retry = endpoint.NoRetry()
		} else {
			// About 9 s in all. (A database outage is not spent on them:
			// the bus pauses consumption until the database answers.)
			ep.Retry = endpoint.Exponential(cs.cfg.Retries, 100*time.Millisecond, 2*time.Second)
		}
	}
	for _, name := range n.OrderEndpoints() {
		e.ReceiveEndpoint(name, func(ep *endpoint.Endpoint) {
			configure(ep)
			endpoint.Consumer(ep, cs.order(name), endpoint.AsMessageType(n.OrderType()), endpoint.Named("order"))
		})
	}
	e.ReceiveEndpoint(n.Audit(), func(ep *endpoint.Endpoint) {
		configure(ep)
		endpoint.Consumer(ep, cs.followup(n.Audit()), endpoint.AsMessageType(n.FollowupType()), endpoint.Named("followup"))
	})
}

// order returns the consumer of orders on endpoint name.
func (cs *consumers) order(name string) func(ctx context.Context, c *endpoint.Context[workload.Order]) error {
	n := cs.cfg.Names
	effects := n.Table(workload.TableEffects)
	return func(ctx context.Context, c *endpoint.Context[workload.Order]) error {
		if err := cs.injectFailure(c.MessageID, name, c.Attempt); err != nil {
			return err
		}
		tx := bus.TxFromContext(ctx)
		if tx == nil {
			return endpoint.Permanent(errors.New("testsvc: consumer context carries no transaction"))
		}
		cs.attempts.Add(1)
		if err := tx.Exec(`INSERT INTO `+effects+` (message_id, endpoint, instance, attempt) VALUES (?, ?, ?, ?)`,
			c.MessageID, name, cs.cfg.Instance, c.Attempt).Error; err != nil {
			return fmt.Errorf("write effect: %w", err)
		}
		if class := c.Headers[workload.HeaderPoisonClass]; class != "" {
			// The poison profile: the effect above must never commit.
			if err, handled := misbehave(ctx, workload.PoisonClass(class), tx); handled {
				return err
			}
		}
		// A fresh message id on purpose: were this handler's effect applied
		// twice, the two follow-ups would be two messages, both consumed,
		// and the checker would see two follow-up rows.
		if err := c.Publish(ctx, workload.Followup{OriginID: c.MessageID, SourceEndpoint: name},
			bus.Headers{bus.HeaderMessageType: n.FollowupType()}); err != nil {
			return fmt.Errorf("publish follow-up: %w", err)
		}
		return cs.work(ctx)
	}
}

// followup returns the audit endpoint's consumer.
func (cs *consumers) followup(name string) func(ctx context.Context, c *endpoint.Context[workload.Followup]) error {
	followups := cs.cfg.Names.Table(workload.TableFollowups)
	return func(ctx context.Context, c *endpoint.Context[workload.Followup]) error {
		if err := cs.injectFailure(c.MessageID, name, c.Attempt); err != nil {
			return err
		}
		tx := bus.TxFromContext(ctx)
		if tx == nil {
			return endpoint.Permanent(errors.New("testsvc: consumer context carries no transaction"))
		}
		cs.attempts.Add(1)
		if err := tx.Exec(`INSERT INTO `+followups+` (followup_id, origin_id, source_endpoint, instance) VALUES (?, ?, ?, ?)`,
			c.MessageID, c.Message.OriginID, c.Message.SourceEndpoint, cs.cfg.Instance).Error; err != nil {
			return fmt.Errorf("write follow-up: %w", err)
		}
		return cs.work(ctx)
	}
}

func (cs *consumers) injectFailure(id, endpointName string, attempt int) error {
	if attempt == 1 && workload.FailsFirstAttempt(id, endpointName, cs.cfg.FailFirst) {
		cs.injected.Add(1)
		return errInjected
	}
	return nil
}

// work stands for the handler's remaining work: it holds the transaction
// (with the effect written but not committed) for HandlerDelay, so that a
// kill or stop of the process lands mid-handler.
func (cs *consumers) work(ctx context.Context) error {
	if cs.cfg.HandlerDelay <= 0 {
		return nil
	}
	t := time.NewTimer(cs.cfg.HandlerDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
