package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// Factory is what a transport package hands to bus.WithTransport: the
// receive endpoints declared in the transport's configuration block, and a
// way to build the transport once the bus knows its own settings.
type Factory interface {
	// Endpoints returns the receive endpoints declared in the
	// transport's block, with the errors their declarations collected.
	Endpoints() *endpoint.Endpoints
	// Build validates the configuration and returns the transport. It
	// performs no I/O: connecting is Transport.Start's job. bus.New
	// wraps its errors in bus.ErrInvalidOption.
	Build(env Env) (Transport, error)
}

// Env is what the bus tells a transport when it builds it.
type Env struct {
	// Logger is the bus's logger. Never nil.
	Logger *slog.Logger
	// RelayLease is the outbox relay's lease on a claimed batch. A
	// transport that may wait for publish confirms must keep its wait
	// below half of it, or another relay could claim and send the batch
	// again (RabbitMQ's PublishTimeout).
	RelayLease time.Duration
	// OnCommitted, when not nil, is called with the messages a
	// TxDeliverer wrote in a transaction, once that transaction has
	// committed (the bus counts them as published).
	OnCommitted func(msgs []*outbox.Message)
}

// Named is implemented by transports that name their messaging system
// for telemetry and logs ("rabbitmq", "postgresql", "inproc"), as the
// OpenTelemetry attribute messaging.system.
type Named interface {
	System() string
}

// ErrUnroutable is wrapped by delivery errors of a message the broker
// returned because no queue received it (a mandatory publish).
var ErrUnroutable = errors.New("transport: message unroutable")

// ErrTxUnsupported is wrapped by TxDeliverer.DeliverTx when it cannot
// write in the given transaction (the transaction is on another
// database): the caller then uses the outbox.
var ErrTxUnsupported = errors.New("transport: cannot deliver in this transaction")

// MandatoryDeliverer is implemented by transports whose publishes to an
// exchange may silently reach no queue (RabbitMQ): DeliverMandatory fails
// such a message with an error wrapping ErrUnroutable instead.
type MandatoryDeliverer interface {
	DeliverMandatory(ctx context.Context, msgs []*outbox.Message) []error
}

// TxDeliverer is implemented by transports that can write messages in the
// caller's database transaction, so that publishing from a transaction
// needs no outbox row and no relay hop (the PostgreSQL transport, when the
// transaction is on its database).
type TxDeliverer interface {
	// DeliverTx writes msgs in the transaction carried by ctx
	// (gormstore.WithTx). They become visible when it commits. It
	// returns an error wrapping ErrTxUnsupported or
	// outbox.ErrTransportUnavailable when the caller must use the outbox
	// instead.
	DeliverTx(ctx context.Context, msgs []*outbox.Message) error
}

// TxAcker is implemented by transports that can acknowledge a delivery in
// the transaction that commits the consumer's effects (the PostgreSQL
// transport, when the inbox is on its database): the message is then
// acknowledged if and only if the effects commit.
type TxAcker interface {
	// AckTx acknowledges msg in the transaction carried by ctx and
	// reports whether it did.
	AckTx(ctx context.Context, msg *message.Message) (bool, error)
	// AckedInTx is called once that transaction has committed.
	AckedInTx(msg *message.Message)
}

// HealthDetailer is implemented by transports that add details to the
// bus's transport health check (bus.CheckHealth), such as the broker node
// they are connected to.
type HealthDetailer interface {
	HealthDetails() map[string]any
}

// ErrDropUnsupported is returned by a transport's DropConnection when it
// has no connection to drop.
var ErrDropUnsupported = errors.New("transport: DropConnection is not supported")

// ConnDropper is implemented by transports that can lose their connection
// on demand, as in a network failure (fault injection for tests:
// bustest's Harness.DropConnection).
type ConnDropper interface {
	DropConnection() error
}

// CheckPlainEndpoints reports the settings of eps that only a broker with
// queue arguments and exchange-to-exchange routing (RabbitMQ) can honour,
// for transports that have neither (in-process, PostgreSQL): any
// Endpoint.Queue setting, and bindings with a routing key, arguments or an
// exchange destination. name prefixes the errors.
func CheckPlainEndpoints(name string, eps []*endpoint.Endpoint) []error {
	var errs []error
	for _, ep := range eps {
		if !ep.Queue.IsZero() {
			errs = append(errs, fmt.Errorf("%s: endpoint %q sets Queue (type, TTL, dead-letter exchange, length limits, arguments): those are RabbitMQ queue settings, which this transport does not have; remove them", name, ep.Name()))
		}
		for _, b := range ep.Bindings {
			if b.ToExchange != "" || b.RoutingKey != "" || len(b.Args) > 0 {
				errs = append(errs, fmt.Errorf("%s: endpoint %q binds exchange %q with a routing key, arguments or an exchange destination: this transport routes every message of an exchange to each bound queue, so only Exchange (and Queue) may be set", name, ep.Name(), b.Exchange))
			}
		}
	}
	return errs
}
