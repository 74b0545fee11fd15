package rabbitmq

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// declarer runs declarations on a channel and replaces the channel after a
// refusal (the broker closes a channel that had a declaration refused).
type declarer struct {
	t    *Transport
	conn *amqp.Connection
	ch   *amqp.Channel
	errs []error
}

func (d *declarer) channel() (*amqp.Channel, error) {
	if d.ch != nil && !d.ch.IsClosed() {
		return d.ch, nil
	}
	var ch *amqp.Channel
	err := d.t.bounded(d.conn, "open channel", func() (err error) {
		ch, err = d.conn.Channel()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: rabbitmq: open channel: %w", outbox.ErrTransportUnavailable, d.t.secret.scrubErr(err))
	}
	d.ch = ch
	return ch, nil
}

// do runs one declaration; a failure is recorded with what names the object.
func (d *declarer) do(what string, f func(ch *amqp.Channel) error) bool {
	if d.conn.IsClosed() {
		if len(d.errs) == 0 || !errors.Is(d.errs[len(d.errs)-1], outbox.ErrTransportUnavailable) {
			d.errs = append(d.errs, fmt.Errorf("%w: rabbitmq: connection closed while declaring %s", outbox.ErrTransportUnavailable, what))
		}
		return false
	}
	ch, err := d.channel()
	if err != nil {
		d.errs = append(d.errs, fmt.Errorf("rabbitmq: declare %s: %w", what, err))
		return false
	}
	if err := d.t.bounded(d.conn, "declare "+what, func() error { return f(ch) }); err != nil {
		d.errs = append(d.errs, fmt.Errorf("rabbitmq: declare %s: %w", what, d.t.secret.scrubErr(err)))
		d.t.closeChannel(d.conn, ch)
		d.ch = nil
		return false
	}
	return true
}

func (d *declarer) close() {
	if d.ch != nil {
		d.t.closeChannel(d.conn, d.ch)
		d.ch = nil
	}
}

// exchange declares x and remembers it.
func (d *declarer) exchange(x Exchange) {
	kind := string(x.Kind)
	if kind == "" {
		kind = string(FanoutExchange)
	}
	if d.do(fmt.Sprintf("exchange %q", x.Name), func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(x.Name, kind, !x.Transient, x.AutoDelete, false, false, amqpArgs(x.Args))
	}) {
		d.t.rememberExchange(x.Name)
	}
}

// ensureExchange makes sure an exchange that is referenced but not declared
// exists: an existing one (of any kind) is used as it is, a missing one is
// created as a durable fanout exchange.
func (d *declarer) ensureExchange(name string) {
	if name == "" || d.t.knownExchange(name) {
		return
	}
	ch, err := d.channel()
	if err != nil {
		d.errs = append(d.errs, fmt.Errorf("rabbitmq: declare exchange %q: %w", name, err))
		return
	}
	if err := d.t.bounded(d.conn, fmt.Sprintf("declare exchange %q (passive)", name), func() error {
		return ch.ExchangeDeclarePassive(name, string(FanoutExchange), true, false, false, false, nil)
	}); err == nil {
		d.t.rememberExchange(name)
		return
	}
	d.ch = nil // a failed passive declare closes the channel
	d.exchange(Exchange{Name: name, Kind: FanoutExchange})
}

func (d *declarer) queue(q endpoint.Queue) {
	d.do(fmt.Sprintf("queue %q", q.Name), func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q.Name, !q.Transient, q.AutoDelete, false, false, queueArgs(q))
		return err
	})
}

// replyQueue declares a bus instance's reply queue: classic, transient and
// exclusive, so that it goes away with the connection and no other
// connection can consume it. Not auto-delete: a consumer that resumes on a
// new channel after its channel failed must find it still there.
func (d *declarer) replyQueue(name string) {
	d.do(fmt.Sprintf("reply queue %q", name), func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, false, false, true, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic})
		return err
	})
}

func (d *declarer) binding(b endpoint.Binding) {
	d.ensureExchange(b.Exchange)
	if b.ToExchange != "" {
		d.ensureExchange(b.ToExchange)
		d.do(fmt.Sprintf("binding of exchange %q to exchange %q (routing key %q)", b.ToExchange, b.Exchange, b.RoutingKey), func(ch *amqp.Channel) error {
			return ch.ExchangeBind(b.ToExchange, b.RoutingKey, b.Exchange, false, amqpArgs(b.Args))
		})
		return
	}
	d.do(fmt.Sprintf("binding of queue %q to exchange %q (routing key %q)", b.Queue, b.Exchange, b.RoutingKey), func(ch *amqp.Channel) error {
		return ch.QueueBind(b.Queue, b.RoutingKey, b.Exchange, false, amqpArgs(b.Args))
	})
}

// queueArgs builds the x-arguments of a queue declaration. Explicit fields
// win over the same keys in Args.
func queueArgs(q endpoint.Queue) amqp.Table {
	args := amqpArgs(q.Args)
	set := func(k string, v any) {
		if args == nil {
			args = amqp.Table{}
		}
		args[k] = v
	}
	if q.Type != "" {
		set(amqp.QueueTypeArg, string(q.Type))
	}
	if q.DeadLetterExchange != "" {
		set("x-dead-letter-exchange", q.DeadLetterExchange)
	}
	if q.DeadLetterRoutingKey != "" {
		set("x-dead-letter-routing-key", q.DeadLetterRoutingKey)
	}
	if q.MessageTTL > 0 {
		set("x-message-ttl", q.MessageTTL.Milliseconds())
	}
	if q.MaxLength > 0 {
		set("x-max-length", int64(q.MaxLength))
	}
	if q.MaxLengthBytes > 0 {
		set("x-max-length-bytes", int64(q.MaxLengthBytes))
	}
	if q.Overflow != "" {
		set("x-overflow", q.Overflow)
	}
	return args
}

// endpointQueue is the declaration of an endpoint's queue: its Queue with
// the Config's QueueType when it sets none. A quorum queue also gets,
// unless the endpoint sets them itself:
//   - x-delivery-limit (Config.DeliveryLimit), so that a message that keeps
//     coming back (its consumer crashes on it) ends;
//   - the endpoint's error queue as dead-letter target (the default
//     exchange, routing key = the error queue), so that such a message is
//     kept there rather than dropped;
//   - x-dead-letter-strategy at-least-once with x-overflow reject-publish,
//     which it needs: otherwise the broker dead-letters at most once and a
//     message can be lost between the two queues.
func (t *Transport) endpointQueue(ep *endpoint.Endpoint) endpoint.Queue {
	q := ep.Queue
	q.Name = ep.Name()
	if q.Type == "" && t.cfg.QueueType == endpoint.Quorum {
		q.Type = endpoint.Quorum
	}
	if q.Type != endpoint.Quorum || t.cfg.DeliveryLimit < 0 {
		return q
	}
	args := make(map[string]any, len(q.Args)+5)
	for k, v := range q.Args {
		args[k] = v
	}
	setDefault := func(k string, v any) {
		if _, ok := args[k]; !ok {
			args[k] = v
		}
	}
	setDefault("x-delivery-limit", int64(t.cfg.DeliveryLimit))
	_, dlxArg := args["x-dead-letter-exchange"]
	if q.DeadLetterExchange == "" && !dlxArg && ep.ErrorQueue != "" {
		args["x-dead-letter-exchange"] = ""
		setDefault("x-dead-letter-routing-key", ep.ErrorQueue)
	}
	if q.Overflow == "" {
		setDefault("x-overflow", "reject-publish")
	}
	if q.Overflow == "reject-publish" || (q.Overflow == "" && args["x-overflow"] == "reject-publish") {
		setDefault("x-dead-letter-strategy", "at-least-once")
	}
	q.Args = args
	return q
}

// errorQueue is the declaration of an endpoint's error queue: durable, of
// the endpoint queue's type (after Config.QueueType), except that a stream
// endpoint gets a classic error queue.
func (t *Transport) errorQueue(ep *endpoint.Endpoint) endpoint.Queue {
	typ := t.endpointQueue(ep).Type
	if typ == endpoint.Stream {
		typ = endpoint.Classic
	}
	return endpoint.Queue{Name: ep.ErrorQueue, Type: typ}
}

// declareTopology declares, in this order so that every reference resolves:
// user exchanges, one fanout exchange per consumed message type, endpoint
// queues and their error queues, user queues, then every binding. Declaring
// is idempotent. Every refusal is reported, naming the object and quoting the
// broker.
func (t *Transport) declareTopology(conn *amqp.Connection) error {
	t.mu.Lock()
	eps := t.endpoints
	t.mu.Unlock()
	topo := t.cfg.Topology

	d := &declarer{t: t, conn: conn}
	defer d.close()

	declared := map[string]bool{}
	for _, x := range topo.Exchanges {
		d.exchange(x)
		declared[x.Name] = true
	}
	for _, ep := range eps {
		for _, mt := range ep.MessageTypes() {
			if declared[mt] {
				continue
			}
			declared[mt] = true
			d.exchange(Exchange{Name: mt, Kind: FanoutExchange})
		}
	}
	for _, ep := range eps {
		// The error queue first: a quorum endpoint queue dead-letters
		// into it. Declared with a dead-letter exchange too: it takes the
		// dead letters that exchange cannot route.
		if ep.ErrorQueue != "" {
			d.queue(t.errorQueue(ep))
		}
		d.queue(t.endpointQueue(ep))
		if ep.Partitions() > 0 {
			d.declareOrdered(ep)
		}
	}
	for _, q := range topo.Queues {
		d.queue(q)
	}
	t.mu.Lock()
	replies := slices.Clone(t.replies)
	t.mu.Unlock()
	for _, name := range replies {
		d.replyQueue(name)
	}
	for _, ep := range eps {
		for _, mt := range ep.MessageTypes() {
			if ep.Partitions() > 0 { // through the key router (ordering.go)
				d.binding(endpoint.Binding{Exchange: mt, ToExchange: orderedExchange(ep)})
				d.unbindDirect(mt, ep)
				continue
			}
			d.binding(endpoint.Binding{Exchange: mt, Queue: ep.Name()})
		}
		for _, b := range ep.Bindings {
			if b.Queue == "" && b.ToExchange == "" {
				if ep.Partitions() > 0 {
					b.ToExchange = orderedExchange(ep)
				} else {
					b.Queue = ep.Name()
				}
			}
			d.binding(b)
		}
	}
	for _, b := range topo.Bindings {
		d.binding(b)
	}
	if len(d.errs) == 0 {
		return nil
	}
	return &TopologyError{Errs: d.errs}
}

// TopologyError lists every declaration the broker refused.
type TopologyError struct {
	Errs []error
}

func (e *TopologyError) Error() string {
	if len(e.Errs) == 1 {
		return e.Errs[0].Error()
	}
	msgs := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("rabbitmq: %d topology declarations failed:\n%s", len(e.Errs), strings.Join(msgs, "\n"))
}

// Unwrap exposes the individual errors to errors.Is and errors.As.
func (e *TopologyError) Unwrap() []error { return e.Errs }
