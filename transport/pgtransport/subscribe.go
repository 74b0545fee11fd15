package pgtransport

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/transport"
)

// settleTimeout bounds the short statements that settle or extend a claim.
const settleTimeout = 10 * time.Second

// Subscriber returns a new message.Subscriber on this transport. Each
// Subscribe call on it is one competing consumer of a queue (the topic is
// the endpoint's, hence the queue's, name). Closing the subscriber stops
// only the subscriptions made through it; closing the transport stops all.
func (t *Transport) Subscriber() message.Subscriber {
	return &subscriber{t: t, subs: transport.NewSubscriptions(t.ctx, "pgtransport")}
}

type subscriber struct {
	t    *Transport
	subs *transport.Subscriptions
}

// Subscribe starts one consumer of queue. It claims one message at a time
// (FOR UPDATE SKIP LOCKED, then a lease), hands it out, and waits for the
// verdict while extending the lease: an ack deletes the row, a nack makes
// it visible again after RedeliveryDelay, to any consumer. The consumer
// then takes the next message at once; a nacked message never holds up the
// ones behind it.
//
// When ctx is done or the subscriber is closed, the channel is closed after
// the message in flight (if any) has its verdict, which is then applied; a
// message claimed but not yet handed out is released at once. When the
// transport is closed, the consumer stops without waiting and the message
// in flight is redelivered after Lease.
func (s *subscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	t := s.t
	admit := func() (func(), error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.closed {
			return nil, errClosed
		}
		if !t.started {
			return nil, errors.New("pgtransport: subscribe: transport not started")
		}
		t.wg.Add(1)
		return t.wg.Done, nil
	}
	return s.subs.Start(ctx, queue, admit, func(ctx context.Context, out chan<- *message.Message) {
		sub := &subscription{t: t, queue: queue, out: out, sig: t.signal(queue), log: t.log.With(slog.String("queue", queue))}
		sub.run(ctx)
	})
}

// Close stops every subscription made through this subscriber and waits for
// them to finish.
func (s *subscriber) Close() error { return s.subs.Close() }

type subscription struct {
	t     *Transport
	queue string
	out   chan<- *message.Message
	sig   *signal
	log   *slog.Logger
}

// claimed is one leased row.
type claimed struct {
	id         int64
	deliveries int
	msg        *message.Message
	// ackedInTx is set by AckedInTx once the transaction that deleted the
	// row (AckTx) has committed: the ack then has nothing left to do.
	ackedInTx atomic.Bool
}

func (s *subscription) run(ctx context.Context) {
	failing := false
	backoff := 100 * time.Millisecond
	for {
		c, err := s.claim(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				s.log.Warn("postgres transport: claiming a message failed; retrying", "error", err)
			} else {
				s.log.Debug("postgres transport: claiming a message failed; retrying", "error", err, "retry_in", backoff)
			}
			failing = true
			if !sleep(ctx, s.t.ctx.Done(), jitter(backoff)) {
				return
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		if failing {
			s.log.Info("postgres transport: claiming works again")
			failing, backoff = false, 100*time.Millisecond
		}
		if c == nil {
			select {
			case <-ctx.Done():
				return
			case <-s.t.ctx.Done():
				return
			case <-s.sig.ch:
			case <-time.After(s.idleWait(ctx)):
			}
			continue
		}
		// There may be more: let an idle sibling look too.
		s.sig.fire()
		if !s.handle(ctx, c) {
			return
		}
	}
}

// idleWait is how long an idle consumer sleeps unless woken: until the
// next row of the queue becomes visible again (a nacked message's delay or
// a lease running out, which no NOTIFY announces), at most PollInterval.
func (s *subscription) idleWait(ctx context.Context) time.Duration {
	wait := jitter(s.t.cfg.PollInterval)
	qctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	var next sql.NullFloat64
	err := s.t.sqlDB.QueryRowContext(qctx, s.t.schema.nextDueSQL, s.queue).Scan(&next)
	if err == nil && next.Valid {
		wait = min(wait, max(time.Duration(next.Float64*float64(time.Second))+5*time.Millisecond, 5*time.Millisecond))
	}
	return wait
}

// claim leases the oldest visible row of the queue, or returns nil.
func (s *subscription) claim(ctx context.Context) (*claimed, error) {
	q, err := s.t.schema.SelectQuery(wsql.SelectQueryParams{Topic: s.queue})
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	// Not canceled with ctx: a claim that the server committed must reach
	// us, or the row would stay leased with no one handling it.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	rows, err := s.t.sqlDB.QueryContext(qctx, q.Query, q.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, rows.Err()
	}
	r, err := s.t.schema.UnmarshalMessage(wsql.UnmarshalMessageParams{Row: rows})
	if err != nil {
		// The row cannot be read as a message. It stays leased and comes
		// back after Lease; say loudly which row it is.
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	d, _ := r.ExtraData[deliveriesKey].(int)
	return &claimed{id: r.Offset, deliveries: d, msg: r.Msg}, nil
}

// handle hands c out and applies the verdict. It returns false when the
// subscription must stop.
func (s *subscription) handle(ctx context.Context, c *claimed) bool {
	// The handler's context lives as long as the transport: stopping the
	// subscription lets the handler finish (the router waits for it), and
	// closing the transport cancels it.
	mctx, cancel := context.WithCancel(s.t.ctx)
	defer cancel()
	c.msg.SetContext(mctx)
	s.t.inflight.Store(c.msg, c)
	defer s.t.inflight.Delete(c.msg)
	select {
	case s.out <- c.msg:
	case <-ctx.Done():
		s.release(c, 0)
		return false
	case <-s.t.ctx.Done():
		s.release(c, 0)
		return false
	}
	heartbeat := time.NewTicker(s.t.cfg.Lease / 3)
	defer heartbeat.Stop()
	for {
		select {
		case <-c.msg.Acked():
			s.ack(c)
			return ctx.Err() == nil
		case <-c.msg.Nacked():
			s.release(c, s.t.cfg.RedeliveryDelay)
			return ctx.Err() == nil
		case <-heartbeat.C:
			s.extend(c)
		case <-s.t.ctx.Done():
			// Closing the transport: do not wait for the handler. The
			// lease runs out and the message is redelivered.
			return false
		}
	}
}

func (s *subscription) exec(query string, args ...any) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	res, err := s.t.sqlDB.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// The delivery count fences every statement to the claim that made it: if
// the lease ran out and another consumer claimed the row, these change
// nothing.

func (s *subscription) ack(c *claimed) {
	if c.ackedInTx.Load() {
		return // deleted by the handler's own transaction (AckTx)
	}
	n, err := s.exec(s.t.schema.ackSQL, c.id, c.deliveries)
	switch {
	case err != nil:
		s.log.Warn("postgres transport: ack failed; the message will be redelivered after its lease", "message_id", c.msg.UUID, "row", c.id, "error", err)
	case n == 0:
		s.leaseLost(c)
	}
}

// release makes the row visible again after delay (a nack, or a message
// claimed but not handed out).
func (s *subscription) release(c *claimed, delay time.Duration) {
	s.move(c, delay, "postgres transport: releasing a message failed; it will be redelivered after its lease")
}

// extend pushes the lease forward while the handler runs.
func (s *subscription) extend(c *claimed) {
	s.move(c, s.t.cfg.Lease, "postgres transport: extending a lease failed")
}

func (s *subscription) move(c *claimed, after time.Duration, failure string) {
	n, err := s.exec(s.t.schema.moveSQL, c.id, c.deliveries, after.Seconds())
	switch {
	case err != nil:
		s.log.Warn(failure, "message_id", c.msg.UUID, "row", c.id, "error", err)
	case n == 0:
		s.leaseLost(c)
	}
}

func (s *subscription) leaseLost(c *claimed) {
	s.log.Warn("postgres transport: lease lost (it ran out and another consumer took the message, or the row is gone); the inbox absorbs the repeat",
		"message_id", c.msg.UUID, "row", c.id, "lease", s.t.cfg.Lease.String())
}

// sleep waits d unless one of the channels closes first; it reports
// whether d passed.
func sleep(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-done:
		return false
	case <-tm.C:
		return true
	}
}

// jitter spreads d by ±10% so that idle consumers do not poll in step.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d + time.Duration((rand.Float64()*0.2-0.1)*float64(d))
}
