package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// DeclareReplyQueue declares queue name, a bus instance's reply queue
// (bus.Request), on the current connection: classic, transient and
// exclusive to the connection, so the broker deletes it when the
// connection ends and no other process can consume it. It is declared
// again after every reconnect (responses sent while the connection was down
// are lost: their requests time out). Responses reach it through the
// default exchange from any connection; once it is gone, a response is
// returned unroutable and the responder's relay drops it.
func (t *Transport) DeclareReplyQueue(ctx context.Context, name string) error {
	conn, err := t.waitConn(ctx)
	if err != nil {
		return fmt.Errorf("%w: rabbitmq: declare reply queue %q: %w", outbox.ErrTransportUnavailable, name, err)
	}
	t.mu.Lock()
	if !slices.Contains(t.replies, name) {
		t.replies = append(t.replies, name)
	}
	t.mu.Unlock()
	d := &declarer{t: t, conn: conn}
	d.replyQueue(name)
	d.close()
	if len(d.errs) > 0 {
		return d.errs[0]
	}
	return nil
}

// DeleteReplyQueue deletes reply queue name and stops declaring it. (It
// would go with the connection anyway.)
func (t *Transport) DeleteReplyQueue(_ context.Context, name string) error {
	t.mu.Lock()
	t.replies = slices.DeleteFunc(t.replies, func(q string) bool { return q == name })
	t.mu.Unlock()
	conn, err := t.currentConn()
	if err != nil {
		return nil // gone with the connection
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: delete reply queue %q: open channel: %w", name, t.secret.scrubErr(err))
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		return fmt.Errorf("rabbitmq: delete reply queue %q: %w", name, t.secret.scrubErr(err))
	}
	return nil
}

// Subscriber returns a new message.Subscriber on this transport. Each
// Subscribe call on it is one competing consumer of a queue (the topic is the
// endpoint's, hence the queue's, name) on its own channel. Closing the
// subscriber stops only the subscriptions made through it; closing the
// transport stops all of them.
func (t *Transport) Subscriber() message.Subscriber {
	return &subscriber{t: t, subs: transport.NewSubscriptions(t.ctx, "rabbitmq")}
}

type subscriber struct {
	t    *Transport
	subs *transport.Subscriptions
}

// prefetchFor divides an endpoint's PrefetchCount across its concurrent
// handlers (one subscription each; BatchDeliveriesPerHandler per slot with
// group commit), rounding up, at least 1.
func prefetchFor(ep *endpoint.Endpoint) int {
	limit := endpoint.DefaultConcurrentMessageLimit
	if ep != nil && ep.ConcurrentMessageLimit > 0 {
		limit = ep.ConcurrentMessageLimit
	}
	prefetch := limit
	if ep != nil && ep.PrefetchCount > 0 {
		prefetch = ep.PrefetchCount
	}
	if ep != nil && ep.BatchEnabled() {
		// The bus subscribes BatchDeliveriesPerHandler times per slot
		// (group commit): the endpoint's PrefetchCount is shared by all.
		limit *= endpoint.BatchDeliveriesPerHandler
	}
	return max(1, (prefetch+limit-1)/limit)
}

// Subscribe starts one consumer of queue. Messages come one at a time: the
// next is sent after the previous one is acked (basic.ack) or nacked
// (basic.nack with requeue). The output channel is closed when ctx is done
// or the subscriber is closed, after the message handed out (if any) has
// its verdict, which is then applied; closing the transport requeues it
// without waiting. Broker connection losses are survived:
// the consumer resumes on a new channel after the reconnect.
func (s *subscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	t := s.t
	var ep *endpoint.Endpoint
	admit := func() (func(), error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.closed {
			return nil, errClosed
		}
		if !t.started {
			return nil, errors.New("rabbitmq: subscribe: transport not started")
		}
		ep = t.byName[queue]
		t.wg.Add(1)
		return t.wg.Done, nil
	}
	return s.subs.Start(ctx, queue, admit, func(ctx context.Context, out chan<- *message.Message) {
		sub := &subscription{
			t:        t,
			queue:    queue,
			prefetch: prefetchFor(ep),
			out:      out,
			log:      t.log.With(slog.String("queue", queue)),
		}
		sub.run(ctx)
	})
}

// Close stops every subscription made through this subscriber and waits for
// them to finish.
func (s *subscriber) Close() error { return s.subs.Close() }

type subscription struct {
	t        *Transport
	queue    string
	prefetch int
	out      chan<- *message.Message
	log      *slog.Logger
}

func (s *subscription) run(ctx context.Context) {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     100 * time.Millisecond,
		RandomizationFactor: 0.3,
		Multiplier:          2,
		MaxInterval:         s.t.cfg.ReconnectMaxInterval,
	}
	b.Reset()
	for {
		conn, err := s.t.waitConn(ctx)
		if err != nil {
			return
		}
		err = s.consume(ctx, conn, b.Reset)
		if ctx.Err() != nil {
			return
		}
		wait := min(b.NextBackOff(), s.t.cfg.ReconnectMaxInterval)
		s.log.Warn("rabbitmq consumer interrupted, resuming",
			slog.String("error", s.t.secret.scrub(err.Error())), slog.Duration("retry_in", wait))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// consume runs one consumer on a fresh channel until ctx is done (nil) or
// the channel or consumer ends (an error).
func (s *subscription) consume(ctx context.Context, conn *amqp.Connection, started func()) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Qos(s.prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch %d: %w", s.prefetch, err)
	}
	deliveries, err := ch.Consume(s.queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume queue %q: %w", s.queue, err)
	}
	started()
	s.log.Debug("rabbitmq consumer started", slog.Int("prefetch", s.prefetch))
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				if ch.IsClosed() {
					return errors.New("channel closed")
				}
				return fmt.Errorf("broker cancelled the consumer of queue %q (queue deleted?)", s.queue)
			}
			if err := s.handle(ctx, &d); err != nil {
				return err
			}
		}
	}
}

// handle hands one delivery to the router and settles it with the broker.
// It returns nil unless settling failed on a broken channel.
//
// Stopping the subscription (ctx: the router closing, bus.Stop) drains: a
// delivery not yet handed out is requeued, one handed out keeps running
// and is settled by its verdict; the caller then returns and the channel's
// close requeues whatever the broker prefetched. Closing the transport
// (Stop's deadline passed) cancels the handler and requeues at once.
func (s *subscription) handle(ctx context.Context, d *amqp.Delivery) error {
	msg := fromDelivery(d)
	mctx, cancel := context.WithCancel(s.t.ctx)
	defer cancel()
	msg.SetContext(mctx)

	requeue := func() {
		if err := d.Nack(false, true); err != nil {
			s.log.Debug("rabbitmq nack on shutdown failed; the broker requeues unacked messages when the channel closes",
				slog.String("message_id", msg.UUID), slog.String("error", err.Error()))
		}
	}
	// A stop wins over a ready receiver: no delivery starts after it.
	if ctx.Err() != nil {
		requeue()
		return nil
	}
	select {
	case s.out <- msg:
	case <-ctx.Done():
		requeue()
		return nil
	}
	var err error
	select {
	case <-msg.Acked():
		err = d.Ack(false)
	case <-msg.Nacked():
		err = d.Nack(false, true)
	case <-s.t.ctx.Done():
		select {
		case <-msg.Acked(): // acked just as we were closed: keep the ack
			_ = d.Ack(false)
		default:
			requeue()
		}
		return nil
	}
	if err != nil {
		s.log.Warn("rabbitmq settle failed; the broker will redeliver the message",
			slog.String("message_id", msg.UUID), slog.String("error", s.t.secret.scrub(err.Error())))
		return fmt.Errorf("settle message %q: %w", msg.UUID, err)
	}
	return nil
}
