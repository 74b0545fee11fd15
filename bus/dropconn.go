package bus

import (
	"errors"

	"github.com/barewire-go/barewire/internal/rabbit"
)

// ErrDropUnsupported is returned by DropConnection on a transport that
// cannot drop its connection on demand (the PostgreSQL transport).
var ErrDropUnsupported = errors.New("bus: DropConnection is supported on the in-process transport and RabbitMQ only")

// DropConnection is fault injection for tests (bustest's
// Harness.DropConnection): the transport loses its connection as in a
// network failure. On the in-process transport (the embedded default)
// every delivery handed to a consumer and not yet acknowledged goes back
// to its queue at once and is delivered again, flagged redelivered, while
// the consumer that had it may still be running (its late ack is ignored);
// the inbox makes the second delivery wait for the first and skip it as a
// duplicate. On RabbitMQ the connection is closed: the bus reconnects and
// the broker redelivers what was not acknowledged. It returns
// ErrDropUnsupported on the PostgreSQL transport and an error when the bus
// is not connected.
func (b *Bus) DropConnection() error {
	if b.mem != nil {
		b.mem.DropConnection()
		return nil
	}
	if tr, ok := b.tr.(*rabbit.Transport); ok {
		return tr.DropConnection()
	}
	return ErrDropUnsupported
}
