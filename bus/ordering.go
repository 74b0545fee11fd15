package bus

import (
	"errors"
	"fmt"
	"reflect"
	"unicode/utf8"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/transport"
)

// HeaderOrderingKey carries a message's ordering key. An endpoint made
// ordered with Endpoint.Ordered processes the messages of one key one at a
// time, in publish order (docs/ordering.md).
const HeaderOrderingKey = wire.HeaderOrderingKey

// ErrOrderingUnsupported is returned by Start when an endpoint is ordered
// on a transport that cannot route keys to partition queues.
var ErrOrderingUnsupported = errors.New("bus: per-key ordering is not supported by this transport")

// OrderingKey returns headers that give a publish or send the ordering key
// k, merged with any more headers given:
//
//	err := b.Publish(ctx, OrderShipped{OrderID: id}, bus.OrderingKey(id))
//
// An empty key, or one longer than 255 bytes or not valid UTF-8, is refused
// at publish with ErrInvalidMessage.
func OrderingKey(k string, more ...Headers) Headers {
	return merge(Headers{HeaderOrderingKey: k}, more)
}

// WithOrderingKey derives the ordering key of every message of type T this
// bus publishes or sends without a BW-OrderingKey header of its own, from
// the message: the order id of an order event, say.
//
//	bus.WithOrderingKey(func(e OrderShipped) string { return e.OrderID })
//
// A function that returns "" leaves that message without a key. Give at
// most one per type.
func WithOrderingKey[T any](key func(T) string) Option {
	return func(c *config) error {
		if key == nil {
			return optErr("WithOrderingKey: function is nil")
		}
		t := reflect.TypeFor[T]()
		if c.orderingKeys == nil {
			c.orderingKeys = map[reflect.Type]func(any) string{}
		}
		if _, dup := c.orderingKeys[t]; dup {
			return optErr("WithOrderingKey: given twice for %v", t)
		}
		c.orderingKeys[t] = func(m any) string { return key(m.(T)) }
		return nil
	}
}

// orderingKey sets the BW-OrderingKey header of a message being published
// from a function registered for its type, and validates the key.
func (b *Bus) orderingKey(msg any, h Headers) error {
	k, set := h[HeaderOrderingKey]
	if !set {
		if f := b.cfg.orderingKeys[reflect.TypeOf(msg)]; f != nil {
			if k = f(msg); k == "" {
				return nil
			}
			h[HeaderOrderingKey] = k
		} else {
			return nil
		}
	}
	switch {
	case k == "":
		return fmt.Errorf("%w: %s is empty; leave the header out for a message without a key", ErrInvalidMessage, HeaderOrderingKey)
	case len(k) > wire.MaxOrderingKeyLen:
		return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrInvalidMessage, HeaderOrderingKey, len(k), wire.MaxOrderingKeyLen)
	case !utf8.ValidString(k):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidMessage, HeaderOrderingKey)
	}
	return nil
}

// checkOrdering refuses, at Start, ordered endpoints on a transport that
// cannot route keys to partitions.
func checkOrdering(tr transport.Transport, eps []*endpoint.Endpoint) error {
	if _, ok := tr.(transport.KeyPartitioner); ok {
		return nil
	}
	var errs []error
	for _, ep := range eps {
		if ep.Partitions() > 0 {
			errs = append(errs, fmt.Errorf("%w: endpoint %q is Ordered(%d) on %T; use the RabbitMQ or the in-process transport (docs/ordering.md)", ErrOrderingUnsupported, ep.Name(), ep.Partitions(), tr))
		}
	}
	return errors.Join(errs...)
}
