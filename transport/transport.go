package transport

import (
	"context"
	"maps"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
)

// Metadata keys a transport sets on every received *message.Message, besides
// the message's headers (which are copied into Metadata as they are) and
// msg.UUID (the message id, "" when the message has none).
const (
	// MetaRedelivered is "true" when the broker says it delivered this
	// message before.
	MetaRedelivered = "BW-Redelivered"
	// MetaDeliveryCount is the broker's delivery count when it keeps one
	// (quorum queues' x-delivery-count), as a decimal string.
	MetaDeliveryCount = "BW-DeliveryCount"
)

// Transport moves messages between the bus and a broker.
//
// Routing: an outbox.Message whose Destination is "exchange:<X>" goes to every
// endpoint that consumes message type X (through an exchange named X on
// RabbitMQ, bound to each such endpoint's queue) and to any extra bindings of
// exchange X; "queue:<Q>" goes to queue Q only.
type Transport interface {
	// Start connects (retrying a broker that is down within the
	// transport's connect timeout) and declares what the endpoints need:
	// each endpoint's queue, its error queue, one exchange per consumed
	// message type bound to the queue, extra bindings and user topology.
	// Declaring is idempotent and is repeated after every reconnect.
	Start(ctx context.Context, endpoints []*endpoint.Endpoint) error
	// Subscriber returns the subscriber the router consumes with. The
	// router calls Subscribe(ctx, endpointName) once per concurrent handler
	// of an endpoint: each call is one competing consumer of the endpoint's
	// queue. A nacked message is redelivered; an acked one is gone.
	Subscriber() message.Subscriber
	// Deliver publishes messages and awaits the broker's confirms
	// (pipelined). See outbox.Transport.
	outbox.Transport
	// Health reports nil while connected.
	Health(ctx context.Context) error
	// Close stops consuming and publishing and releases connections.
	Close() error
}

// Headers returns the headers a transport without message properties of
// its own (in-process, PostgreSQL) delivers m with: m's headers plus its id,
// type, content type and correlation id under their wire names (empty ones
// left out). room is how many more entries the caller will add.
func Headers(m *outbox.Message, room int) map[string]string {
	h := make(map[string]string, len(m.Headers)+4+room)
	maps.Copy(h, m.Headers)
	for k, v := range map[string]string{
		wire.HeaderMessageID:     m.MessageID,
		wire.HeaderMessageType:   m.MessageType,
		wire.HeaderContentType:   m.ContentType,
		wire.HeaderCorrelationID: m.CorrelationID,
	} {
		if v != "" {
			h[k] = v
		}
	}
	return h
}

// ReplyQueues is implemented by transports that give a bus instance a
// private queue for the responses to its requests (bus.Request). The bus
// consumes the queue through Subscriber like an endpoint's, after
// DeclareReplyQueue, and acknowledges each response as it takes it.
type ReplyQueues interface {
	// DeclareReplyQueue declares queue name for this process alone, after
	// Start; sends to it ("queue:<name>") from any process reach it. The
	// transport keeps it declared across reconnects. A response sent
	// after the queue is gone must fail (or vanish), never wait.
	DeclareReplyQueue(ctx context.Context, name string) error
	// DeleteReplyQueue removes the queue and what it holds, at Stop. A
	// transport whose reply queues go away on their own (RabbitMQ's
	// exclusive queues) may do nothing.
	DeleteReplyQueue(ctx context.Context, name string) error
}

// KeyPartitioner is implemented by transports that route a message with an
// ordering key (the BW-OrderingKey header) to the partition queue of each
// ordered endpoint it reaches (endpoint.Endpoint.PartitionQueue), declare
// those queues at Start, and let only one consumer at a time take from a
// partition queue across all processes (or say in their docs where they
// cannot). The bus refuses an ordered endpoint on any other transport.
type KeyPartitioner interface {
	PartitionsByKey()
}
