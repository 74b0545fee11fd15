package rabbitmq

import (
	"fmt"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/transport"
)

var _ transport.KeyPartitioner = (*Transport)(nil)

// PartitionsByKey marks the transport as routing ordering keys. An ordered
// endpoint E (endpoint.Endpoint.Ordered(n)) gets, without any broker plugin:
//
//   - queues E.p0 … E.p<n-1>, declared like E's queue (type, delivery
//     limit, error queue) plus x-single-active-consumer, so that the broker
//     hands each partition to one consumer at a time, across processes;
//   - a headers exchange "E.ordered", to which the message-type exchanges
//     and E's extra bindings are bound instead of E's queue, with one
//     binding per slot s (BW-OrderingSlot = s) to partition s % n;
//   - a fanout exchange "E.unkeyed", bound to E's queue and set as the
//     headers exchange's alternate exchange: a message without a slot
//     header (published without a key, or by a foreign publisher) goes to
//     E's own queue, processed concurrently.
//
// Deliver adds the BW-OrderingSlot header to every message that carries a
// BW-OrderingKey.
func (t *Transport) PartitionsByKey() {}

func orderedExchange(ep *endpoint.Endpoint) string { return ep.Name() + ".ordered" }
func unkeyedExchange(ep *endpoint.Endpoint) string { return ep.Name() + ".unkeyed" }

// partitionQueue is the declaration of partition queue name of ep.
func (t *Transport) partitionQueue(ep *endpoint.Endpoint, name string) endpoint.Queue {
	q := t.endpointQueue(ep)
	q.Name = name
	args := make(map[string]any, len(q.Args)+1)
	for k, v := range q.Args {
		args[k] = v
	}
	args["x-single-active-consumer"] = true
	q.Args = args
	return q
}

// declareOrdered declares an ordered endpoint's exchanges and partition
// queues (after its own queue) and the bindings between them.
func (d *declarer) declareOrdered(ep *endpoint.Endpoint) {
	ox, ux := orderedExchange(ep), unkeyedExchange(ep)
	d.exchange(Exchange{Name: ux, Kind: FanoutExchange})
	d.exchange(Exchange{Name: ox, Kind: HeadersExchange, Args: map[string]any{"alternate-exchange": ux}})
	d.binding(endpoint.Binding{Exchange: ux, Queue: ep.Name()})
	qs := ep.PartitionQueues()
	for _, name := range qs {
		d.queue(d.t.partitionQueue(ep, name))
	}
	for s := range wire.OrderingSlots {
		d.binding(endpoint.Binding{Exchange: ox, Queue: qs[s%len(qs)], Args: map[string]any{
			"x-match": "all", wire.HeaderOrderingSlot: strconv.Itoa(s),
		}})
	}
}

// unbindDirect removes the binding of message-type exchange mt to ep's own
// queue, which ep had when it was not ordered: left in place, it would
// copy every message past the partitions. Removing a binding that does
// not exist is a no-op for the broker.
func (d *declarer) unbindDirect(mt string, ep *endpoint.Endpoint) {
	d.do(fmt.Sprintf("removal of the binding of queue %q to exchange %q (the endpoint is ordered now)", ep.Name(), mt), func(ch *amqp.Channel) error {
		return ch.QueueUnbind(ep.Name(), "", mt, nil)
	})
}

// withSlot adds the BW-OrderingSlot header of a keyed message.
func withSlot(headers amqp.Table, key string) amqp.Table {
	if key == "" {
		return headers
	}
	if headers == nil {
		headers = amqp.Table{}
	}
	headers[wire.HeaderOrderingSlot] = strconv.Itoa(wire.OrderingSlot(key))
	return headers
}
