package wire

import (
	"hash/fnv"
	"strconv"
)

// Per-key ordering (docs/ordering.md).
const (
	// HeaderOrderingKey carries a message's ordering key: messages with the
	// same key reach an ordered endpoint's consumer one at a time, in
	// publish order.
	HeaderOrderingKey = "BW-OrderingKey"
	// HeaderOrderingSlot is the key's slot (0..OrderingSlots-1, decimal),
	// which the RabbitMQ transport adds at publish so that the broker
	// routes the message to the slot's partition queue with a headers
	// exchange (no plugin needed).
	HeaderOrderingSlot = "BW-OrderingSlot"
	// OrderingSlots is the number of slots keys hash into; partition i of
	// an endpoint with n partitions takes the slots s with s % n == i, so an
	// endpoint has at most OrderingSlots partitions.
	OrderingSlots = 64
	// MaxOrderingKeyLen bounds an ordering key (it is also an AMQP header
	// and an indexed outbox column).
	MaxOrderingKeyLen = 255
)

// OrderingSlot returns key's slot: FNV-1a (32 bit) modulo OrderingSlots,
// the same in every process and every release.
func OrderingSlot(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % OrderingSlots)
}

// PartitionOf returns the partition (0..partitions-1) a key goes to.
func PartitionOf(key string, partitions int) int {
	return OrderingSlot(key) % partitions
}

// PartitionQueue names partition i of endpoint ep's queue: "<ep>.p<i>".
func PartitionQueue(ep string, i int) string { return ep + ".p" + strconv.Itoa(i) }
