package bus

import (
	"context"

	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// DeliverRawForTest puts a message with no id on queue, the way a plain
// broker client could.
func DeliverRawForTest(b *Bus, queue string, body []byte) error {
	return b.tr.Deliver(context.Background(), []*outbox.Message{{Destination: "queue:" + queue, Payload: body}})[0]
}

// IdleForTest reports whether no message is in flight, no transport queue
// holds a message and the outbox has nothing pending.
func IdleForTest(b *Bus) bool {
	if b.inFlight.Load() != 0 {
		return false
	}
	if b.mem != nil {
		for _, ep := range b.endpoints {
			if b.mem.Len(ep.Name()) != 0 {
				return false
			}
		}
	}
	st, err := b.outboxSt.Stats(context.Background())
	return err == nil && st.Pending == 0
}

// DeliverForTest hands m to the transport as it is, bypassing the checks
// of Publish (what a foreign producer could put on the broker).
func DeliverForTest(b *Bus, m *outbox.Message) error {
	return b.tr.Deliver(context.Background(), []*outbox.Message{m})[0]
}

// RabbitConnectsForTest returns how many connections the bus's RabbitMQ
// transport has made (1 + reconnects).
func RabbitConnectsForTest(b *Bus) int64 { return b.tr.(*rabbit.Transport).Connects() }
