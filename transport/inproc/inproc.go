package inproc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

var (
	_ transport.Transport      = (*Transport)(nil)
	_ transport.ReplyQueues    = (*Transport)(nil)
	_ transport.KeyPartitioner = (*Transport)(nil)
)

// ErrNoQueue is returned by Deliver for a send to a queue nobody declared.
var ErrNoQueue = errors.New("inproc: no such queue")

// Transport is the in-process transport.
type Transport struct {
	cfg      Config
	mu       sync.Mutex
	queues   map[string]*queue
	bindings map[string][]string           // exchange → queues
	ordered  map[string]*endpoint.Endpoint // an ordered endpoint's queue → it
	closed   bool
	wg       sync.WaitGroup
	done     chan struct{}
	// ctx is every delivered message's context, canceled by Close (the
	// bus's Stop, at its deadline): a handler still running then is told
	// to give up, as on a broker whose connection closes.
	ctx       context.Context
	cancelCtx context.CancelFunc

	subscribed map[*queue]struct{} // queues a consumer reads (Outstanding)
	onSettle   atomic.Pointer[func()]
}

// Config configures the in-process transport: its receive endpoints,
// declared through the embedded Endpoints as on every transport. It has no
// settings of its own.
type Config struct {
	endpoint.Endpoints
}

// New returns an in-process transport, to hand to bus.WithTransport (a bus
// with no transport option uses one with no endpoints). configure declares
// the receive endpoints; it may be nil.
func New(configure func(c *Config)) *Transport {
	t := &Transport{
		queues: map[string]*queue{}, bindings: map[string][]string{}, ordered: map[string]*endpoint.Endpoint{},
		done:       make(chan struct{}),
		subscribed: map[*queue]struct{}{},
	}
	t.ctx, t.cancelCtx = context.WithCancel(context.Background())
	if configure != nil {
		configure(&t.cfg)
	}
	return t
}

// Endpoints returns the receive endpoints declared in New's block.
func (t *Transport) Endpoints() *endpoint.Endpoints { return &t.cfg.Endpoints }

// System names the transport for telemetry: "inproc".
func (t *Transport) System() string { return "inproc" }

// Build checks that the endpoints set nothing this transport cannot honour
// (broker queue settings, bindings between exchanges, routing keys) and
// returns t.
func (t *Transport) Build(transport.Env) (transport.Transport, error) {
	if errs := transport.CheckPlainEndpoints("inproc", t.cfg.List()); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return t, nil
}

type item struct {
	id       string
	headers  map[string]string
	payload  []byte
	attempts int
}

type queue struct {
	mu        sync.Mutex
	items     []*item
	unsettled int           // handed to a consumer, not yet acked or nacked
	ready     chan struct{} // signalled when items are added
	// flights are the deliveries handed to a consumer and not yet settled;
	// DropConnection takes them back.
	flights map[*flight]struct{}
	// front: a message handed back goes to the head of the queue, where it
	// was (an ordered endpoint's partition, whose order must hold).
	front bool
}

// flight is one unsettled delivery. Whoever removes it from its queue's
// flights settles it: the consumer's verdict, or DropConnection.
type flight struct {
	it      *item
	dropped chan struct{} // closed when DropConnection took it back
}

func newQueue() *queue { return &queue{ready: make(chan struct{}, 1), flights: map[*flight]struct{}{}} }

func (q *queue) push(it *item) {
	q.mu.Lock()
	q.items = append(q.items, it)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// putBack returns a delivery to the queue, at its head for a partition
// queue (front), else at its tail. The caller holds q.mu.
func (q *queue) putBack(it *item) {
	if q.front {
		q.items = append([]*item{it}, q.items...)
		return
	}
	q.items = append(q.items, it)
}

func (q *queue) pop() *item {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil
	}
	it := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	q.unsettled++ // counted under the same lock, so that Outstanding never sees it in neither place
	if len(q.items) > 0 {
		// Let another waiting consumer pick up the next one.
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return it
}

// settle ends a popped item's delivery, putting it back first when it was
// handed back (requeue), and tells the OnSettle callback.
func (t *Transport) settle(q *queue, requeue *item) {
	if requeue != nil {
		q.mu.Lock()
		q.putBack(requeue)
		q.unsettled--
		q.mu.Unlock()
		select {
		case q.ready <- struct{}{}:
		default:
		}
	} else {
		q.mu.Lock()
		q.unsettled--
		q.mu.Unlock()
	}
	t.notify()
}

func (t *Transport) notify() {
	if f := t.onSettle.Load(); f != nil {
		(*f)()
	}
}

// OnSettle sets a function called after every delivery is acked or
// handed back: the moments Outstanding can drop. bustest waits on it for idleness.
func (t *Transport) OnSettle(f func()) { t.onSettle.Store(&f) }

// Outstanding counts the messages not yet settled in queues that have a
// consumer: queued, or handed to a consumer and not yet acked. (A delayed
// redelivery waits in the outbox, not here.) Queues nobody consumes (error
// queues) are not counted.
func (t *Transport) Outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for q := range t.subscribed {
		q.mu.Lock()
		n += len(q.items) + q.unsettled
		q.mu.Unlock()
	}
	return n
}

// Len returns how many messages wait in queue name (for tests and samples).
func (t *Transport) Len(name string) int {
	t.mu.Lock()
	q := t.queues[name]
	t.mu.Unlock()
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

func (t *Transport) queue(name string) *queue {
	q := t.queues[name]
	if q == nil {
		q = newQueue()
		t.queues[name] = q
	}
	return q
}

func (t *Transport) bind(exchange, q string) {
	for _, b := range t.bindings[exchange] {
		if b == q {
			return
		}
	}
	t.bindings[exchange] = append(t.bindings[exchange], q)
}

// Start declares each endpoint's queue, error queue and type bindings.
func (t *Transport) Start(_ context.Context, eps []*endpoint.Endpoint) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ep := range eps {
		t.queue(ep.Name())
		t.queue(ep.ErrorQueue)
		for _, typ := range ep.MessageTypes() {
			t.bind(typ, ep.Name())
		}
		for _, b := range ep.Bindings {
			t.bind(b.Exchange, ep.Name())
		}
		if ep.Partitions() > 0 {
			t.ordered[ep.Name()] = ep
			for _, name := range ep.PartitionQueues() {
				t.queue(name).front = true
			}
		}
	}
	return nil
}

// PartitionsByKey marks the transport as routing ordering keys: a message
// published with a BW-OrderingKey to an exchange an ordered endpoint is
// bound to goes to the key's partition queue of that endpoint. Only one
// handler consumes each partition queue, and only in this process.
func (t *Transport) PartitionsByKey() {}

// DeclareReplyQueue declares queue name (a bus instance's reply queue).
func (t *Transport) DeclareReplyQueue(_ context.Context, name string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("inproc: closed: %w", outbox.ErrTransportUnavailable)
	}
	t.queue(name)
	return nil
}

// DeleteReplyQueue removes queue name and the messages in it: later sends
// to it fail with ErrNoQueue.
func (t *Transport) DeleteReplyQueue(_ context.Context, name string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q := t.queues[name]; q != nil {
		delete(t.queues, name)
		delete(t.subscribed, q)
	}
	return nil
}

// Deliver routes each message; a send to an unknown queue fails (wrapping
// ErrNoQueue and transport.ErrUnroutable).
func (t *Transport) Deliver(_ context.Context, msgs []*outbox.Message) []error {
	return t.route(msgs, false)
}

// DeliverMandatory is Deliver where a message to an exchange no queue is
// bound to fails (wrapping transport.ErrUnroutable) instead of vanishing.
func (t *Transport) DeliverMandatory(_ context.Context, msgs []*outbox.Message) []error {
	return t.route(msgs, true)
}

func (t *Transport) route(msgs []*outbox.Message, mandatory bool) []error {
	errs := make([]error, len(msgs))
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		for i := range errs {
			errs[i] = fmt.Errorf("inproc: closed: %w", outbox.ErrTransportUnavailable)
		}
		return errs
	}
	for i, m := range msgs {
		kind, name := wire.ParseDestination(m.Destination)
		var targets []string
		if kind == "exchange" {
			targets = t.bindings[name]
			if mandatory && len(targets) == 0 {
				errs[i] = fmt.Errorf("inproc: message %q to exchange %q reached no queue: %w", m.MessageID, name, transport.ErrUnroutable)
				continue
			}
		} else {
			if _, ok := t.queues[name]; !ok {
				errs[i] = &noQueueError{fmt.Sprintf("%v %q (declare an endpoint with that name)", ErrNoQueue, name)}
				continue
			}
			targets = []string{name}
		}
		h := headersOf(m)
		key := m.Headers[wire.HeaderOrderingKey]
		for _, qn := range targets {
			if ep := t.ordered[qn]; ep != nil && kind == "exchange" {
				if pq, ok := ep.PartitionQueue(key); ok {
					qn = pq
				}
			}
			t.queues[qn].push(&item{id: m.MessageID, headers: maps.Clone(h), payload: m.Payload})
		}
	}
	return errs
}

func headersOf(m *outbox.Message) map[string]string {
	h := transport.Headers(m, 1)
	if m.Destination != "" {
		h[wire.HeaderDestination] = m.Destination
	}
	return h
}

// Subscriber returns the transport itself.
func (t *Transport) Subscriber() message.Subscriber { return (*subscriber)(t) }

// Health is always nil: the transport lives in the process.
func (t *Transport) Health(context.Context) error { return nil }

// Close stops all subscriptions and cancels the context of every message
// still being handled; messages still queued are dropped. It does not wait
// for those handlers.
func (t *Transport) Close() error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.done)
		t.cancelCtx()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return nil
}

type subscriber Transport

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	t := (*Transport)(s)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errors.New("inproc: transport closed")
	}
	q := t.queue(topic)
	t.subscribed[q] = struct{}{}
	t.wg.Add(1)
	t.mu.Unlock()
	out := make(chan *message.Message)
	go func() {
		defer t.wg.Done()
		defer close(out)
		for {
			it := q.pop()
			if it == nil {
				select {
				case <-ctx.Done():
					return
				case <-t.done:
					return
				case <-q.ready:
					continue
				}
			}
			if !t.deliver(ctx, q, it, out) {
				return
			}
		}
	}()
	return out, nil
}

// deliver hands one message to the consumer and waits for its verdict. It
// returns false when the subscription must stop (the message is requeued).
func (t *Transport) deliver(ctx context.Context, q *queue, it *item, out chan<- *message.Message) bool {
	it.attempts++
	msg := message.NewMessage(it.id, it.payload)
	msg.SetContext(t.ctx)
	for k, v := range it.headers {
		msg.Metadata.Set(k, v)
	}
	if it.attempts > 1 {
		msg.Metadata.Set(transport.MetaRedelivered, "true")
	}
	msg.Metadata.Set(transport.MetaDeliveryCount, strconv.Itoa(it.attempts-1))
	select {
	case out <- msg:
	case <-ctx.Done():
		it.attempts--
		t.settle(q, it)
		return false
	case <-t.done:
		t.settle(q, nil)
		return false
	}
	fl := &flight{it: it, dropped: make(chan struct{})}
	q.mu.Lock()
	q.flights[fl] = struct{}{}
	q.mu.Unlock()
	// settle applies the consumer's verdict unless DropConnection already
	// took the delivery back (a broker ignores an ack on a dead channel).
	settle := func(requeue *item) {
		q.mu.Lock()
		_, mine := q.flights[fl]
		delete(q.flights, fl)
		q.mu.Unlock()
		if mine {
			t.settle(q, requeue)
		}
	}
	select {
	case <-msg.Acked():
		settle(nil)
		return true
	case <-msg.Nacked():
		settle(it)
		return true
	case <-fl.dropped:
		// Redelivered already; the consumer's late verdict counts for
		// nothing, as on a broker. Deliver the next message meanwhile.
		return true
	case <-ctx.Done():
	case <-t.done:
		// The transport is closed: its queues go with it, so there is
		// nothing to put the message back into. Close does not wait for
		// a handler that may never return.
		return false
	}
	// The subscription stopped mid-flight while the queue lives on: wait
	// for the handler's verdict so the message is neither lost nor
	// handled twice at once, or for Close (Stop's deadline), which
	// cancels the handler and drops the queues.
	select {
	case <-msg.Acked():
		settle(nil)
	case <-msg.Nacked():
		settle(it)
	case <-fl.dropped:
	case <-t.done:
	}
	return false
}

// DropConnection simulates the loss of a broker connection: every delivery
// handed to a consumer and not yet acknowledged goes back to its queue at
// once, to be delivered again (flagged redelivered), while the consumer
// that had it may still be running; its late ack or nack is ignored. It
// returns how many deliveries it took back.
func (t *Transport) DropConnection() error {
	t.Drop()
	return nil
}

// Drop is DropConnection, reporting how many deliveries it took back.
func (t *Transport) Drop() int {
	t.mu.Lock()
	queues := make([]*queue, 0, len(t.queues))
	for _, q := range t.queues {
		queues = append(queues, q)
	}
	t.mu.Unlock()
	n := 0
	for _, q := range queues {
		q.mu.Lock()
		taken := 0
		for fl := range q.flights {
			delete(q.flights, fl)
			close(fl.dropped)
			again := *fl.it // the consumer may still read the original
			q.putBack(&again)
			q.unsettled--
			taken++
		}
		q.mu.Unlock()
		if taken > 0 {
			select {
			case q.ready <- struct{}{}:
			default:
			}
		}
		n += taken
	}
	if n > 0 {
		t.notify()
	}
	return n
}

func (s *subscriber) Close() error { return nil }

// noQueueError is the error of a send to an undeclared queue: it matches
// ErrNoQueue and transport.ErrUnroutable (a request to it fails as
// unconsumed; a response to a reply queue that is gone is dropped).
type noQueueError struct{ msg string }

func (e *noQueueError) Error() string   { return e.msg }
func (e *noQueueError) Unwrap() []error { return []error{ErrNoQueue, transport.ErrUnroutable} }
