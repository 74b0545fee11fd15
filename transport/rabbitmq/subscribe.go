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
	var ch *amqp.Channel
	if err := t.bounded(conn, "open channel", func() (err error) {
		ch, err = conn.Channel()
		return err
	}); err != nil {
		return fmt.Errorf("rabbitmq: delete reply queue %q: open channel: %w", name, t.secret.scrubErr(err))
	}
	defer t.closeChannel(conn, ch)
	if err := t.bounded(conn, "delete reply queue", func() error {
		_, err := ch.QueueDelete(name, false, false, false)
		return err
	}); err != nil {
		return fmt.Errorf("rabbitmq: delete reply queue %q: %w", name, t.secret.scrubErr(err))
	}
	return nil
}

// Subscriber returns a new message.Subscriber on this transport. Each
// Subscribe call on it is one handler of a queue (the topic is the
// endpoint's, hence the queue's, name). All the handlers of one queue on a
// transport share one broker consumer on one channel (see queueConsumer).
// Closing the subscriber stops only the subscriptions made through it;
// closing the transport stops all of them.
func (t *Transport) Subscriber() message.Subscriber {
	return &subscriber{t: t, subs: transport.NewSubscriptions(t.ctx, "rabbitmq")}
}

type subscriber struct {
	t    *Transport
	subs *transport.Subscriptions
}

// prefetchFor is the QoS of the consumer an endpoint's handlers share: the
// endpoint's PrefetchCount divided over its handlers (ConcurrentMessageLimit
// of them, BatchDeliveriesPerHandler times that with group commit), rounded
// up, at least 1 each, times the handlers: every handler can hold a
// message, and what the broker pushed beyond that waits for whichever
// handler is free first. It counts the handlers the bus subscribes (its
// router adds that many); a caller that subscribes fewer gets the same QoS.
// A queue of no endpoint (a partition of an ordered endpoint, a reply
// queue) has one handler, with one message at a time.
func prefetchFor(ep *endpoint.Endpoint) int {
	if ep == nil {
		return 1
	}
	limit := endpoint.DefaultConcurrentMessageLimit
	if ep.ConcurrentMessageLimit > 0 {
		limit = ep.ConcurrentMessageLimit
	}
	prefetch := limit
	if ep.PrefetchCount > 0 {
		prefetch = ep.PrefetchCount
	}
	if ep.BatchEnabled() {
		// The bus subscribes BatchDeliveriesPerHandler times per slot
		// (group commit): the endpoint's PrefetchCount is shared by all.
		limit *= endpoint.BatchDeliveriesPerHandler
	}
	return limit * max(1, (prefetch+limit-1)/limit)
}

// Subscribe starts one handler of queue. Messages come one at a time: the
// next is sent after the previous one is acked (basic.ack) or nacked
// (basic.nack with requeue). The output channel is closed when ctx is done
// or the subscriber is closed, after the message handed out (if any) has
// its verdict, which is then applied; closing the transport requeues it
// without waiting. Broker connection losses are survived: the queue's
// consumer resumes on a new channel after the reconnect.
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
		qc := t.attach(queue, ep)
		defer t.detach(qc)
		qc.serve(ctx, out)
	})
}

// Close stops every subscription made through this subscriber and waits for
// them to finish.
func (s *subscriber) Close() error { return s.subs.Close() }

// queueConsumer is the one broker consumer of a queue on this transport,
// shared by every handler (Subscribe call) of the queue: it reads the
// deliveries of its channel and hands each to whichever handler is free.
//
// One consumer per queue and process, not one per handler: a quorum queue
// (RabbitMQ 3.10) keeps the consumers of channels that died with a node as
// "suspected down" and makes them active again when the node's Erlang
// distribution comes back, before it finds their processes gone, handing
// them messages that come back with a raised delivery count, and some that
// never come back (docs/guarantees.md, known defects: with one consumer per
// handler, 64 on the dead node, TestClusterNodeLoss lost messages in 5 of
// 18 runs; with one per process, in none of 22). It is also one channel
// and one QoS for the broker to serve instead of one per handler.
type queueConsumer struct {
	t        *Transport
	queue    string
	prefetch int
	log      *slog.Logger
	work     chan *amqp.Delivery // to the handlers; unbuffered
	users    int                 // attached handlers; t.mu
	cancel   context.CancelFunc  // stops run once the last handler has left
	done     chan struct{}       // closed when run has returned
}

// attach returns the consumer of queue, started by its first handler.
func (t *Transport) attach(queue string, ep *endpoint.Endpoint) *queueConsumer {
	t.mu.Lock()
	defer t.mu.Unlock()
	if qc := t.consumers[queue]; qc != nil {
		qc.users++
		return qc
	}
	// Not ended by the transport's close: the handlers are (through their
	// subscriptions), and they settle what they hold on this channel first.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.ctx))
	qc := &queueConsumer{
		t: t, queue: queue, prefetch: prefetchFor(ep),
		log:  t.log.With(slog.String("queue", queue)),
		work: make(chan *amqp.Delivery), users: 1, cancel: cancel, done: make(chan struct{}),
	}
	t.consumers[queue] = qc
	go func() {
		defer close(qc.done)
		qc.run(ctx)
	}()
	return qc
}

// detach ends a handler's use of qc; the last one stops the consumer and
// waits until its channel is closed (the broker requeues what it
// prefetched).
func (t *Transport) detach(qc *queueConsumer) {
	t.mu.Lock()
	qc.users--
	last := qc.users == 0
	if last && t.consumers[qc.queue] == qc {
		delete(t.consumers, qc.queue)
	}
	t.mu.Unlock()
	if last {
		qc.cancel()
		<-qc.done
	}
}

// serve is one handler: it takes deliveries from the consumer until ctx
// is done.
func (qc *queueConsumer) serve(ctx context.Context, out chan<- *message.Message) {
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-qc.work:
			qc.handle(ctx, d, out)
		}
	}
}

// run keeps the consumer going across reconnects until ctx is done.
func (qc *queueConsumer) run(ctx context.Context) {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     100 * time.Millisecond,
		RandomizationFactor: 0.3,
		Multiplier:          2,
		MaxInterval:         qc.t.cfg.ReconnectMaxInterval,
	}
	b.Reset()
	for {
		conn, err := qc.t.waitConn(ctx)
		if err != nil {
			return
		}
		err = qc.consume(ctx, conn, b.Reset)
		if ctx.Err() != nil {
			return
		}
		wait := min(b.NextBackOff(), qc.t.cfg.ReconnectMaxInterval)
		qc.log.Warn("rabbitmq consumer interrupted, resuming",
			slog.String("error", qc.t.secret.scrub(err.Error())), slog.Duration("retry_in", wait))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// consume runs the consumer on a fresh channel until ctx is done (nil) or
// the channel or consumer ends (an error), handing each delivery to a free
// handler.
func (qc *queueConsumer) consume(ctx context.Context, conn *amqp.Connection, started func()) error {
	// Each call bounded (bound.go): a broker that stops reading the
	// connection has it closed under the call.
	var ch *amqp.Channel
	if err := qc.t.bounded(conn, "open consumer channel", func() (err error) {
		ch, err = conn.Channel()
		return err
	}); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = qc.t.bounded(conn, "close consumer channel", ch.Close) }()
	if err := qc.t.bounded(conn, "set prefetch", func() error { return ch.Qos(qc.prefetch, 0, false) }); err != nil {
		return fmt.Errorf("set prefetch %d: %w", qc.prefetch, err)
	}
	var deliveries <-chan amqp.Delivery
	if err := qc.t.bounded(conn, "consume", func() (err error) {
		deliveries, err = ch.Consume(qc.queue, "", false, false, false, false, nil)
		return err
	}); err != nil {
		return fmt.Errorf("consume queue %q: %w", qc.queue, err)
	}
	started()
	qc.log.Debug("rabbitmq consumer started", slog.Int("prefetch", qc.prefetch))
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				if ch.IsClosed() {
					return errors.New("channel closed")
				}
				return fmt.Errorf("broker cancelled the consumer of queue %q (queue deleted?)", qc.queue)
			}
			select {
			case qc.work <- &d:
			case <-ctx.Done():
				// Every handler has left: not handed out, so back to
				// the queue (the channel's close would requeue it too).
				_ = d.Nack(false, true)
				return nil
			}
		}
	}
}

// handle hands one delivery to the router through out and settles it with
// the broker. A failed settle is logged: the channel it came on is gone and
// the broker redelivers the message (the consumer notices the channel's end
// itself).
//
// Stopping the subscription (ctx: the router closing, bus.Stop) drains: a
// delivery not yet handed out is requeued, one handed out keeps running
// and is settled by its verdict; the caller then returns and the channel's
// close requeues whatever the broker prefetched. Closing the transport
// (Stop's deadline passed) cancels the handler and requeues at once.
func (qc *queueConsumer) handle(ctx context.Context, d *amqp.Delivery, out chan<- *message.Message) {
	msg := fromDelivery(d)
	mctx, cancel := context.WithCancel(qc.t.ctx)
	defer cancel()
	msg.SetContext(mctx)

	requeue := func() {
		if err := d.Nack(false, true); err != nil {
			qc.log.Debug("rabbitmq nack on shutdown failed; the broker requeues unacked messages when the channel closes",
				slog.String("message_id", msg.UUID), slog.String("error", err.Error()))
		}
	}
	// A stop wins over a ready receiver: no delivery starts after it.
	if ctx.Err() != nil {
		requeue()
		return
	}
	select {
	case out <- msg:
	case <-ctx.Done():
		requeue()
		return
	}
	var err error
	select {
	case <-msg.Acked():
		err = d.Ack(false)
	case <-msg.Nacked():
		err = d.Nack(false, true)
	case <-qc.t.ctx.Done():
		select {
		case <-msg.Acked(): // acked just as we were closed: keep the ack
			_ = d.Ack(false)
		default:
			requeue()
		}
		return
	}
	if err != nil {
		qc.log.Warn("rabbitmq settle failed; the broker will redeliver the message",
			slog.String("message_id", msg.UUID), slog.String("error", qc.t.secret.scrub(err.Error())))
	}
}
