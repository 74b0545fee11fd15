package bus

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

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
	if b.ctr.inFlight.Load() != 0 {
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
func RabbitConnectsForTest(b *Bus) int64 { return b.tr.(*rabbitmq.Transport).Connects() }

// HandleForTest runs the handler of the endpoint named name on msg, as the
// router would.
func HandleForTest(b *Bus, name string, msg *message.Message) error {
	for _, ep := range b.endpoints {
		if ep.Name() == name {
			return b.handler(ep)(msg)
		}
	}
	return fmt.Errorf("no endpoint %q", name)
}

// SetBatchHooksForTest sets, before Start, functions that see every
// group-commit batch (the ids in the order taken) and every attempt handed
// to the workers (before it waits for one).
func SetBatchHooksForTest(b *Bus, batch func(endpoint string, ids []string), submitted func(id string)) {
	b.batchHook, b.submitHook = batch, submitted
}

// OutagesForTest reports how many times the bus paused consumption for a
// database outage.
func OutagesForTest(b *Bus) int64 {
	_, _, n := b.gate.state()
	return n
}
