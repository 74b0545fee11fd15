package endpoint

import "github.com/barewire-go/barewire/internal/wire"

// MaxPartitions is the most partitions an ordered endpoint may have: keys
// hash into this many slots, and each partition takes a share of them.
const MaxPartitions = wire.OrderingSlots

// Ordered makes the endpoint process messages with the same ordering key
// (the BW-OrderingKey header, set at publish with bus.OrderingKey or a
// function registered with bus.WithOrderingKey) one at a time, in publish
// order, across every instance of the endpoint, while different keys run
// in parallel on up to partitions consumers.
//
// The endpoint gets partitions queues "<name>.p0" … "<name>.p<n-1>"; a
// message published with a key goes to partition slot(key) % partitions
// (docs/ordering.md), each partition is consumed by one handler at a time
// in each instance, and on RabbitMQ by one instance at a time (single
// active consumer). Messages without a key, and sends addressed to the
// endpoint's queue by name, go to the endpoint's own queue and are
// processed concurrently, as on any endpoint.
//
// partitions must be within 1–MaxPartitions. Changing it moves keys to
// other partitions: drain the partition queues first. Ordering cannot be
// combined with Redelivery (a delayed redelivery would let the key's later
// messages overtake) nor with a stream queue.
func (e *Endpoint) Ordered(partitions int) {
	if partitions < 1 || partitions > MaxPartitions {
		e.addErr(configErr("endpoint %q: Ordered(%d): partitions must be within 1–%d", e.name, partitions, MaxPartitions))
		return
	}
	e.partitions = partitions
}

// Partitions returns the endpoint's number of ordering partitions, 0 when
// it is not ordered.
func (e *Endpoint) Partitions() int { return e.partitions }

// PartitionQueues names the endpoint's partition queues, none when it is not
// ordered.
func (e *Endpoint) PartitionQueues() []string {
	qs := make([]string, e.partitions)
	for i := range qs {
		qs[i] = wire.PartitionQueue(e.name, i)
	}
	return qs
}

// PartitionQueue returns the partition queue key goes to; ok is false when
// the endpoint is not ordered or key is empty.
func (e *Endpoint) PartitionQueue(key string) (string, bool) {
	if e.partitions == 0 || key == "" {
		return "", false
	}
	return wire.PartitionQueue(e.name, wire.PartitionOf(key, e.partitions)), true
}

// finishOrdering validates the ordering against the endpoint's other options.
func (e *Endpoint) finishOrdering(bad func(format string, args ...any)) {
	if e.partitions == 0 {
		return
	}
	if len(e.Redelivery) > 0 {
		bad("Ordered cannot be combined with Redelivery: a message waiting for its delayed redelivery would let the later messages of its key overtake it; use in-process Retry (it keeps the message in its partition) and let the dead letter end it")
	}
	if e.Queue.Type == Stream {
		bad("Ordered needs a single active consumer per partition queue, which a stream queue does not offer over AMQP 0.9.1; use endpoint.Classic or endpoint.Quorum")
	}
}
