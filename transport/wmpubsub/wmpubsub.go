package wmpubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

var (
	_ transport.Transport   = (*Transport)(nil)
	_ transport.ReplyQueues = (*Transport)(nil)
)

// Config configures the adapter: the receive endpoints (through the
// embedded Endpoints, as on every transport) and what the adapter cannot
// know about the Pub/Sub. A preset fills everything but Endpoints.
type Config struct {
	endpoint.Endpoints

	// Publisher returns the publisher every message is sent with. Start
	// calls it once; the adapter closes what it returns. Required.
	Publisher func(ctx context.Context) (message.Publisher, error)
	// Subscriber returns the subscriber of one queue (an endpoint, or an
	// error queue). Every subscription it makes must belong to one
	// consumer group named after queue, so that two subscriptions of one
	// queue compete and two queues each get their copy. It is called
	// once per queue, by Start for each endpoint and its error queue, by
	// DeclareReplyQueue for a reply queue, and by Subscribe for any other
	// queue; the adapter closes what it returns (a reply queue's at
	// DeleteReplyQueue). When the subscriber implements
	// message.SubscribeInitializer, Start and DeclareReplyQueue initialize
	// every topic of the queue with it, so that nothing published before
	// the first Subscribe is lost. Required.
	Subscriber func(ctx context.Context, queue string) (message.Subscriber, error)
	// Topics maps destinations onto topics. Defaults to the names as they
	// are.
	Topics Topics
	// Semantics says what the Pub/Sub does with a nack.
	Semantics Semantics
	// Health reports nil while the Pub/Sub is reachable. A publish error
	// while Health fails is charged to the connection (the relay retries
	// the message without counting an attempt); any other publish error
	// to the message. Defaults to always nil.
	Health func(ctx context.Context) error
	// QueueExists, when set, reports whether the topic of a queue
	// (Topics.Queue) exists on the Pub/Sub: an endpoint's Start or
	// DeclareReplyQueue created it, and DeleteQueue has not removed it.
	// Deliver then fails a message sent to a queue whose topic does not
	// exist with an error wrapping transport.ErrUnroutable and
	// outbox.ErrUndeliverable (the relay parks the row with its reason;
	// bus.Request fails at once with bus.ErrNoConsumer) instead of writing
	// it where nobody reads it, creating the topic again. Without it such a
	// message is published like any other. A failed look-up fails the
	// message as outbox.ErrTransportUnavailable (the relay retries it
	// without counting an attempt). Messages to a type's topic are
	// never checked: a type no endpoint consumes reaches no one, as on
	// RabbitMQ.
	QueueExists func(ctx context.Context, topic string) (bool, error)
	// DeleteQueue, when set, removes the topic of a reply queue (a
	// stream, a RabbitMQ queue) when the bus deletes the queue
	// (DeleteReplyQueue, also at Close for every reply queue still
	// declared), so that an instance's reply topics do not outlive it.
	DeleteQueue func(ctx context.Context, topic string) error
	// OnClose, when set, is called after the publisher and subscribers are
	// closed, to release what the preset opened.
	OnClose func() error
	// System names the messaging system for telemetry ("nats", "redis").
	// Defaults to "watermill".
	System string
	// PublishTimeout bounds each publish, whatever the Pub/Sub's client
	// does with the context (watermill-amqp waits for its confirm without
	// a limit, and a broker blocking its publishers in a resource alarm
	// never sends it): a publish without an answer by then fails as
	// outbox.ErrTransportUnavailable (the relay retries it uncounted; if
	// the Pub/Sub publishes it after all, the receiving inbox absorbs the
	// copy). Negative is an error. Defaults to 30s, or half of the
	// outbox's RelayLease when that is shorter.
	PublishTimeout time.Duration
}

// DefaultPublishTimeout is Config.PublishTimeout's default (when half of
// RelayLease is not shorter).
const DefaultPublishTimeout = 30 * time.Second

// maxStuckPublishes bounds the publishes still waiting for the Pub/Sub
// after their PublishTimeout: past it Deliver fails at once rather than
// start another that would wait too.
const maxStuckPublishes = 16

// closeTimeout bounds Close's wait for the publisher, the subscribers and
// the preset's own close, which a Pub/Sub that stopped answering can hold.
const closeTimeout = 10 * time.Second

// Topics maps the bus's destinations onto Pub/Sub topics. Both functions
// must be injective on the names a service uses, and their images must not
// overlap.
type Topics struct {
	// Type is the topic of messages published to a message type
	// ("exchange:T"), which every endpoint consuming T subscribes to.
	// Defaults to T.
	Type func(messageType string) string
	// Queue is the topic of messages sent to one queue ("queue:Q"): an
	// endpoint, its error queue. Defaults to Q.
	Queue func(queue string) string
}

// Semantics declares what the Pub/Sub does that the adapter cannot see.
type Semantics struct {
	// NackRedelivers says that a nacked message comes back to the same
	// consumer group (watermill-amqp requeues it, JetStream naks it,
	// watermill-redisstream resends it in process). When false, the
	// adapter publishes the message again to its queue's topic and then
	// acknowledges the original.
	NackRedelivers bool
	// NackGoesBehind says that a message nacked over and over does not
	// hold up the messages behind it (JetStream). False where a nack
	// puts it back at the head (watermill-amqp) or resends it at once in
	// process (watermill-redisstream, watermill-kafka). The bus nacks
	// only when it must hand a message back (a busy inbox entry, the
	// database down, shutdown): failures are retried in process, delayed
	// through the outbox and dead-lettered to the error topic.
	NackGoesBehind bool
	// AckPerOffset says that acknowledgements move a partition offset
	// (Kafka): a message held by a slow consumer holds back its
	// partition, and consumers compete per partition, not per message.
	AckPerOffset bool
}

// Factory is what New returns, to hand to bus.WithTransport.
type Factory struct{ cfg Config }

// New returns the adapter's factory. configure sets the Pub/Sub and
// declares the receive endpoints; presets call it for you.
func New(configure func(c *Config)) *Factory {
	f := &Factory{}
	if configure != nil {
		configure(&f.cfg)
	}
	return f
}

// Endpoints returns the receive endpoints declared in New's block.
func (f *Factory) Endpoints() *endpoint.Endpoints { return &f.cfg.Endpoints }

// Build validates the configuration; it does no I/O.
func (f *Factory) Build(env transport.Env) (transport.Transport, error) {
	c := f.cfg
	var errs []error
	if c.Publisher == nil {
		errs = append(errs, errors.New("wmpubsub: Config.Publisher is nil; set it to return your message.Publisher, or use a preset (wmamqp, wmnats, wmredis, wmkafka)"))
	}
	if c.Subscriber == nil {
		errs = append(errs, errors.New("wmpubsub: Config.Subscriber is nil; set it to return the message.Subscriber of a queue's consumer group, or use a preset"))
	}
	errs = append(errs, transport.CheckPlainEndpoints("wmpubsub", c.List())...)
	if c.PublishTimeout < 0 {
		errs = append(errs, fmt.Errorf("wmpubsub: Config.PublishTimeout %v is negative; use 0 for the default (%v, or half of RelayLease when shorter)", c.PublishTimeout, DefaultPublishTimeout))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if c.Topics.Type == nil {
		c.Topics.Type = func(s string) string { return s }
	}
	if c.Topics.Queue == nil {
		c.Topics.Queue = func(s string) string { return s }
	}
	if c.System == "" {
		c.System = "watermill"
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
		if half := env.RelayLease / 2; half > 0 && half < c.PublishTimeout {
			c.PublishTimeout = half
		}
	}
	log := env.Logger
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transport{cfg: c, log: log.With("transport", c.System), ctx: ctx, cancel: cancel,
		subs: map[string]message.Subscriber{}, eps: map[string]*endpoint.Endpoint{}, nacked: map[string]struct{}{},
		replies: map[string]replyQueue{}}
	t.book = transport.NewSubscriptions(ctx, "wmpubsub")
	return t, nil
}

// Transport is the adapter, running.
type Transport struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	book   *transport.Subscriptions
	bridge sync.WaitGroup // goroutines relaying a verdict to the inner message

	mu     sync.Mutex
	pub    message.Publisher
	subs   map[string]message.Subscriber // by queue
	eps    map[string]*endpoint.Endpoint
	closed bool
	// replies holds the reply queues declared and not deleted yet, each
	// with the cancel of its consumers' context (DeleteReplyQueue stops
	// them, so that none resubscribes to a closed subscriber).
	replies map[string]replyQueue
	// nacked holds "queue\x00id" of messages nacked by a consumer of
	// queue, so that their next delivery is flagged redelivered where the
	// Pub/Sub does not say so itself. Bounded by maxNacked.
	nacked map[string]struct{}
	// stuck counts publishes given up on at PublishTimeout whose call to
	// the Pub/Sub has not returned yet.
	stuck atomic.Int32
}

const maxNacked = 10000

// System names the messaging system for telemetry.
func (t *Transport) System() string { return t.cfg.System }

// Start opens the publisher and each endpoint's subscriber, and
// initializes their topics where the subscriber can.
func (t *Transport) Start(ctx context.Context, eps []*endpoint.Endpoint) error {
	t.mu.Lock()
	for _, ep := range eps {
		t.eps[ep.Name()] = ep
	}
	havePub := t.pub != nil
	t.mu.Unlock()
	if !havePub {
		pub, err := t.cfg.Publisher(ctx)
		if err != nil {
			return fmt.Errorf("wmpubsub: open publisher: %w", err)
		}
		t.mu.Lock()
		t.pub = pub
		t.mu.Unlock()
	}
	for _, ep := range eps {
		for _, q := range []string{ep.Name(), ep.ErrorQueue} {
			if q == "" {
				continue
			}
			if err := t.initialize(ctx, q); err != nil {
				return err
			}
		}
	}
	return nil
}

// initialize opens the subscriber of queue and initializes each of its
// topics where the subscriber can (message.SubscribeInitializer), so that
// nothing published to them before the first Subscribe is lost.
func (t *Transport) initialize(ctx context.Context, queue string) error {
	sub, err := t.subscriber(ctx, queue)
	if err != nil {
		return err
	}
	init, ok := sub.(message.SubscribeInitializer)
	if !ok {
		return nil
	}
	for _, tp := range t.topics(queue) {
		if err := init.SubscribeInitialize(tp.name); err != nil {
			return fmt.Errorf("wmpubsub: initialize topic %q of queue %q: %w", tp.name, queue, err)
		}
	}
	return nil
}

// replyQueue is a declared reply queue: its consumers run under ctx.
type replyQueue struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// DeclareReplyQueue makes name a queue like any other: topic
// Topics.Queue(name), consumed through Config.Subscriber with name's own
// consumer group (the bus picks a name unique to the instance). It opens
// the queue's subscriber and initializes its topic where the subscriber
// can, as Start does for an endpoint, so that a response published before
// the bus's first Subscribe is kept; a subscription that ends is made
// again on the same subscriber and consumer group, like an endpoint's.
// Declaring a declared queue again does nothing.
func (t *Transport) DeclareReplyQueue(ctx context.Context, name string) error {
	if name == "" {
		return errors.New("wmpubsub: declare reply queue: empty name")
	}
	t.mu.Lock()
	_, declared := t.replies[name]
	started := t.pub != nil
	t.mu.Unlock()
	if declared {
		return nil
	}
	if !started {
		return fmt.Errorf("wmpubsub: declare reply queue %q: transport not started: %w", name, outbox.ErrTransportUnavailable)
	}
	if err := t.initialize(ctx, name); err != nil {
		return fmt.Errorf("wmpubsub: declare reply queue: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("wmpubsub: declare reply queue: transport closed")
	}
	if _, ok := t.replies[name]; !ok {
		rctx, cancel := context.WithCancel(t.ctx)
		t.replies[name] = replyQueue{ctx: rctx, cancel: cancel}
	}
	return nil
}

// DeleteReplyQueue stops the consumers of reply queue name, closes its
// subscriber and removes its topic with Config.DeleteQueue. Without
// DeleteQueue the topic stays where the Pub/Sub keeps topics (a JetStream
// stream, a Redis stream, a RabbitMQ queue); with QueueExists a response
// sent to it later fails as unroutable, without it the response is
// published and read by no one.
func (t *Transport) DeleteReplyQueue(ctx context.Context, name string) error {
	t.mu.Lock()
	rq, ok := t.replies[name]
	delete(t.replies, name)
	var sub message.Subscriber
	if ok {
		sub = t.subs[name]
		delete(t.subs, name)
	}
	t.mu.Unlock()
	if !ok {
		return nil
	}
	rq.cancel()
	var errs []error
	// Both calls reach the Pub/Sub, whose clients may ignore ctx: bounded.
	if sub != nil {
		if err := t.bounded(ctx, sub.Close); err != nil {
			errs = append(errs, fmt.Errorf("wmpubsub: close subscriber of reply queue %q: %w", name, err))
		}
	}
	if t.cfg.DeleteQueue != nil {
		if err := t.bounded(ctx, func() error { return t.cfg.DeleteQueue(ctx, t.cfg.Topics.Queue(name)) }); err != nil {
			errs = append(errs, fmt.Errorf("wmpubsub: delete reply queue %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func (t *Transport) subscriber(ctx context.Context, queue string) (message.Subscriber, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("wmpubsub: transport closed")
	}
	if s := t.subs[queue]; s != nil {
		return s, nil
	}
	s, err := t.cfg.Subscriber(ctx, queue)
	if err != nil {
		return nil, fmt.Errorf("wmpubsub: open subscriber of queue %q: %w", queue, err)
	}
	t.subs[queue] = s
	return s, nil
}

// topic is one topic a queue consumes, and the type it carries ("" for
// the queue's own topic).
type topic struct{ name, typ string }

// topics returns the topics queue consumes: its own, then one per
// consumed type and per extra binding of the endpoint named queue.
func (t *Transport) topics(queue string) []topic {
	out := []topic{{name: t.cfg.Topics.Queue(queue)}}
	t.mu.Lock()
	ep := t.eps[queue]
	t.mu.Unlock()
	if ep == nil {
		return out
	}
	seen := map[string]bool{out[0].name: true}
	add := func(typ string) {
		n := t.cfg.Topics.Type(typ)
		if !seen[n] {
			seen[n] = true
			out = append(out, topic{name: n, typ: typ})
		}
	}
	for _, typ := range ep.MessageTypes() {
		add(typ)
	}
	for _, b := range ep.Bindings {
		add(b.Exchange)
	}
	return out
}

// TopicOf returns the topic a message to destination ("exchange:T",
// "queue:Q") is published to.
func (t *Transport) TopicOf(destination string) string {
	kind, name := wire.ParseDestination(destination)
	if kind == "exchange" {
		return t.cfg.Topics.Type(name)
	}
	return t.cfg.Topics.Queue(name)
}

// Deliver publishes each message to its destination's topic, one at a
// time: each error is the publisher's for that message.
func (t *Transport) Deliver(ctx context.Context, msgs []*outbox.Message) []error {
	errs := make([]error, len(msgs))
	t.mu.Lock()
	pub, closed := t.pub, t.closed
	t.mu.Unlock()
	for i, m := range msgs {
		switch {
		case closed:
			errs[i] = fmt.Errorf("wmpubsub: closed: %w", outbox.ErrTransportUnavailable)
			continue
		case pub == nil:
			errs[i] = fmt.Errorf("wmpubsub: not started: %w", outbox.ErrTransportUnavailable)
			continue
		case ctx.Err() != nil:
			errs[i] = fmt.Errorf("wmpubsub: %w: %w", ctx.Err(), outbox.ErrTransportUnavailable)
			continue
		}
		tp := t.TopicOf(m.Destination)
		if err := t.checkQueue(ctx, m, tp); err != nil {
			errs[i] = err
			continue
		}
		wm := ToMessage(m)
		wm.SetContext(ctx)
		errs[i] = t.publish(ctx, pub, tp, wm)
	}
	return errs
}

// publish publishes wm to topic tp within PublishTimeout and ctx.
func (t *Transport) publish(ctx context.Context, pub message.Publisher, tp string, wm *message.Message) error {
	err := t.bounded(ctx, func() error { return pub.Publish(tp, wm) })
	if err == nil {
		return nil
	}
	err = fmt.Errorf("wmpubsub: publish %q to topic %q: %w", wm.UUID, tp, err)
	if errors.Is(err, outbox.ErrTransportUnavailable) {
		return err
	}
	return t.classify(ctx, err)
}

// bounded runs call, a call to the Pub/Sub, waiting at most PublishTimeout
// and until ctx is done: it runs in a goroutine of its own, left to finish
// by itself when the wait gives up (counted in stuck). Giving up, or
// finding maxStuckPublishes calls still waiting, fails with an error
// wrapping outbox.ErrTransportUnavailable.
func (t *Transport) bounded(ctx context.Context, call func() error) error {
	if n := t.stuck.Load(); n >= maxStuckPublishes {
		return fmt.Errorf("%d earlier calls still wait for the Pub/Sub: %w", n, outbox.ErrTransportUnavailable)
	}
	done := make(chan error, 1)
	go func() { done <- call() }()
	timer := time.NewTimer(t.cfg.PublishTimeout)
	defer timer.Stop()
	var why error
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		why = ctx.Err()
	case <-timer.C:
		why = fmt.Errorf("no answer from the Pub/Sub within PublishTimeout %v", t.cfg.PublishTimeout)
	}
	t.stuck.Add(1)
	go func() {
		<-done
		t.stuck.Add(-1)
	}()
	return fmt.Errorf("%w: %w", why, outbox.ErrTransportUnavailable)
}

// checkQueue fails m when it is sent to a queue whose topic tp does not
// exist (Config.QueueExists).
func (t *Transport) checkQueue(ctx context.Context, m *outbox.Message, tp string) error {
	if t.cfg.QueueExists == nil {
		return nil
	}
	if kind, _ := wire.ParseDestination(m.Destination); kind == "exchange" {
		return nil
	}
	var ok bool
	err := t.bounded(ctx, func() (err error) {
		ok, err = t.cfg.QueueExists(ctx, tp)
		return err
	})
	if err != nil {
		// The question was about the topic, not the message: charge the
		// connection, whatever Health says by now.
		if errors.Is(err, outbox.ErrTransportUnavailable) {
			return fmt.Errorf("wmpubsub: look up topic %q of %q: %w", tp, m.MessageID, err)
		}
		return fmt.Errorf("wmpubsub: look up topic %q of %q: %w: %w", tp, m.MessageID, err, outbox.ErrTransportUnavailable)
	}
	if !ok {
		return &noQueueError{id: m.MessageID, dest: m.Destination, topic: tp}
	}
	return nil
}

// noQueueError is a send to a queue whose topic does not exist.
type noQueueError struct{ id, dest, topic string }

func (e *noQueueError) Error() string {
	return fmt.Sprintf("wmpubsub: message %q to %s: topic %q does not exist (no endpoint or reply queue declared it)", e.id, e.dest, e.topic)
}

// Unwrap makes the error match transport.ErrUnroutable and
// outbox.ErrUndeliverable.
func (e *noQueueError) Unwrap() []error {
	return []error{transport.ErrUnroutable, outbox.ErrUndeliverable}
}

// classify charges err to the connection when Health fails.
func (t *Transport) classify(ctx context.Context, err error) error {
	if t.cfg.Health == nil {
		return err
	}
	if herr := t.cfg.Health(ctx); herr != nil {
		return fmt.Errorf("%w (%v): %w", err, herr, outbox.ErrTransportUnavailable)
	}
	return err
}

// ToMessage returns the Watermill message the adapter publishes for m:
// UUID = message id, metadata = m's headers plus its type, content type,
// correlation id and destination under the bus's header names.
func ToMessage(m *outbox.Message) *message.Message {
	h := transport.Headers(m, 1)
	if m.Destination != "" {
		h[wire.HeaderDestination] = m.Destination
	}
	// The stock marshalers write the UUID there themselves, and
	// watermill-redisstream refuses a message whose metadata has it.
	delete(h, wire.HeaderWatermillUUID)
	wm := message.NewMessage(m.MessageID, m.Payload)
	wm.Metadata = h
	return wm
}

// Subscriber returns the subscriber the bus consumes with.
func (t *Transport) Subscriber() message.Subscriber { return (*subscriber)(t) }

// Health calls Config.Health.
func (t *Transport) Health(ctx context.Context) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return errors.New("wmpubsub: transport closed")
	}
	if t.cfg.Health == nil {
		return nil
	}
	return t.cfg.Health(ctx)
}

// Close stops consuming, hands every unsettled delivery back (nack),
// closes the subscribers and the publisher, deletes the reply queues still
// declared (Config.DeleteQueue) and releases what the preset opened. A
// Pub/Sub that stopped answering can hold those closes: after closeTimeout
// (10s) Close returns an error saying so and leaves them running.
func (t *Transport) Close() error {
	done := make(chan error, 1)
	go func() { done <- t.close() }()
	timer := time.NewTimer(closeTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("wmpubsub: close did not finish within %v (the Pub/Sub does not answer; %d publishes still wait for it); abandoned", closeTimeout, t.stuck.Load())
	}
}

func (t *Transport) close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	replies := slices.Collect(maps.Keys(t.replies))
	t.mu.Unlock()
	t.cancel()
	// The consumers first (no new verdict to relay after them), then the
	// relays, which hand unsettled deliveries back now that t.ctx is done.
	_ = t.book.Close()
	t.bridge.Wait()
	t.mu.Lock()
	subs, pub := maps.Clone(t.subs), t.pub
	t.mu.Unlock()
	var errs []error
	for q, s := range subs {
		if err := s.Close(); err != nil {
			errs = append(errs, fmt.Errorf("wmpubsub: close subscriber of %q: %w", q, err))
		}
	}
	if pub != nil {
		if err := pub.Close(); err != nil {
			errs = append(errs, fmt.Errorf("wmpubsub: close publisher: %w", err))
		}
	}
	if t.cfg.DeleteQueue != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, name := range replies {
			if err := t.cfg.DeleteQueue(ctx, t.cfg.Topics.Queue(name)); err != nil {
				errs = append(errs, fmt.Errorf("wmpubsub: delete reply queue %q: %w", name, err))
			}
		}
		cancel()
	}
	if t.cfg.OnClose != nil {
		if err := t.cfg.OnClose(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type subscriber Transport

// Subscribe starts one competing consumer of queue: one subscription per
// topic of the queue, merged into one channel.
func (s *subscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	t := (*Transport)(s)
	sub, err := t.subscriber(ctx, queue)
	if err != nil {
		return nil, err
	}
	topics := t.topics(queue)
	t.mu.Lock()
	rq, isReply := t.replies[queue]
	t.mu.Unlock()
	return t.book.Start(ctx, queue, func() (func(), error) { return func() {}, nil },
		func(ctx context.Context, out chan<- *message.Message) {
			if isReply { // DeleteReplyQueue stops it
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer context.AfterFunc(rq.ctx, cancel)()
				defer cancel()
			}
			var wg sync.WaitGroup
			for _, tp := range topics {
				wg.Add(1)
				go func() {
					defer wg.Done()
					t.consume(ctx, sub, queue, tp, out)
				}()
			}
			wg.Wait()
		})
}

func (s *subscriber) Close() error { return nil }

// resubscribeDelay is the wait before subscribing again to a topic whose
// subscription failed or ended while its consumer was still wanted.
const resubscribeDelay = time.Second

// consume subscribes to one topic of queue until ctx is done: a failed
// subscription, or one the inner subscriber ended on its own (a lost
// connection), is made again after resubscribeDelay, so that a topic is
// never left unconsumed.
func (t *Transport) consume(ctx context.Context, sub message.Subscriber, queue string, tp topic, out chan<- *message.Message) {
	for {
		in, err := sub.Subscribe(ctx, tp.name)
		if err != nil {
			t.log.Error("subscribe failed; trying again", "queue", queue, "topic", tp.name, "error", err)
		} else {
			t.forward(ctx, queue, tp, in, out)
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			t.log.Warn("subscription ended; subscribing again", "queue", queue, "topic", tp.name)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(resubscribeDelay):
		}
	}
}

// forward hands each message of in to out, mapped onto the bus's
// metadata, and relays the consumer's verdict to the inner message.
func (t *Transport) forward(ctx context.Context, queue string, tp topic, in <-chan *message.Message, out chan<- *message.Message) {
	for inner := range in {
		msg := t.fromInner(queue, tp, inner)
		// The handler's context: the inner message's values, canceled
		// by Close (Stop's deadline), not by the inner subscription,
		// whose context ends as soon as Stop closes the router: Stop
		// drains the handlers in flight.
		mctx, cancel := context.WithCancel(context.WithoutCancel(inner.Context()))
		unhook := context.AfterFunc(t.ctx, cancel)
		msg.SetContext(mctx)
		release := func() { unhook(); cancel() }
		select {
		case out <- msg:
		case <-ctx.Done():
			release()
			inner.Nack()
			continue // drain: the inner subscriber closes in once it sees ctx
		}
		t.bridge.Add(1)
		go t.settle(queue, tp, inner, msg, release)
	}
}

// settle waits for the consumer's verdict on msg and applies it to inner,
// then releases msg's context. When the transport closes first, inner is
// handed back.
func (t *Transport) settle(queue string, tp topic, inner, msg *message.Message, release func()) {
	defer t.bridge.Done()
	defer release()
	select {
	case <-msg.Acked():
		inner.Ack()
	case <-msg.Nacked():
		t.noteNack(queue, msg.UUID)
		if t.cfg.Semantics.NackRedelivers {
			inner.Nack()
			return
		}
		t.republish(queue, inner)
	case <-t.ctx.Done():
		inner.Nack()
	}
}

// republish sends inner again to its queue's topic and acknowledges it,
// for a Pub/Sub whose nack does not redeliver. When the publish fails the
// inner message is nacked, whatever that does.
func (t *Transport) republish(queue string, inner *message.Message) {
	t.mu.Lock()
	pub := t.pub
	t.mu.Unlock()
	again := message.NewMessage(inner.UUID, inner.Payload)
	again.Metadata = maps.Clone(inner.Metadata)
	delete(again.Metadata, wire.HeaderWatermillUUID)
	if pub == nil || t.bounded(t.ctx, func() error { return pub.Publish(t.cfg.Topics.Queue(queue), again) }) != nil {
		inner.Nack()
		return
	}
	inner.Ack()
}

func (t *Transport) noteNack(queue, id string) {
	if id == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.nacked) >= maxNacked {
		clear(t.nacked)
	}
	t.nacked[queue+"\x00"+id] = struct{}{}
}

func (t *Transport) wasNacked(queue, id string) bool {
	if id == "" {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := queue + "\x00" + id
	_, ok := t.nacked[k]
	delete(t.nacked, k)
	return ok
}

// fromInner maps a received Watermill message onto what the bus reads.
func (t *Transport) fromInner(queue string, tp topic, inner *message.Message) *message.Message {
	md := make(message.Metadata, len(inner.Metadata)+4)
	maps.Copy(md, inner.Metadata)
	id := inner.UUID
	if id == "" {
		id = md.Get(wire.HeaderMessageID)
	}
	delete(md, wire.HeaderWatermillUUID)
	if id != "" {
		md.Set(wire.HeaderMessageID, id)
	}
	if md.Get(wire.HeaderMessageType) == "" {
		if n := md.Get(wire.HeaderWatermillName); n != "" {
			md.Set(wire.HeaderMessageType, n)
		} else if tp.typ != "" {
			md.Set(wire.HeaderMessageType, tp.typ)
		}
	}
	if md.Get(wire.HeaderDestination) == "" {
		if tp.typ != "" {
			md.Set(wire.HeaderDestination, wire.ExchangePrefix+tp.typ)
		} else {
			md.Set(wire.HeaderDestination, wire.QueuePrefix+queue)
		}
	}
	if t.wasNacked(queue, id) {
		md.Set(transport.MetaRedelivered, "true")
	}
	if md.Get(transport.MetaRedelivered) == "" {
		md.Set(transport.MetaRedelivered, "false")
	}
	msg := message.NewMessage(id, inner.Payload)
	msg.Metadata = md
	return msg
}
