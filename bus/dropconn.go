package bus

import (
	"fmt"

	"github.com/barewire-go/barewire/transport"
)

// DropConnection is fault injection for tests (bustest's
// Harness.DropConnection): the transport loses its connection as in a
// network failure. On the in-process transport (the embedded default)
// every delivery handed to a consumer and not yet acknowledged goes back
// to its queue at once and is delivered again, flagged redelivered, while
// the consumer that had it may still be running (its late ack is ignored);
// the inbox makes the second delivery wait for the first and skip it as a
// duplicate. On RabbitMQ the connection is closed: the bus reconnects and
// the broker redelivers what was not acknowledged. On a transport that
// cannot (the PostgreSQL transport) it returns an error wrapping
// transport.ErrDropUnsupported.
func (b *Bus) DropConnection() error {
	if d, ok := b.tr.(transport.ConnDropper); ok {
		return d.DropConnection()
	}
	return fmt.Errorf("bus: %s transport: %w", b.system, transport.ErrDropUnsupported)
}
