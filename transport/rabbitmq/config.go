package rabbitmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/barewire-go/barewire/endpoint"
)

// Config configures the RabbitMQ transport: the receive endpoints
// (declared through the embedded Endpoints, as on every transport),
// connection settings and extra topology. Zero fields take the defaults
// written on each.
type Config struct {
	endpoint.Endpoints
	// Topology declares extra exchanges, queues and bindings.
	Topology Topology

	// URLs are more broker addresses (amqp:// or amqps:// URLs, each with
	// its credentials and vhost), tried after New's url: list every node of
	// a cluster. Start connects to the first address that answers, trying
	// them in order; when the connection is lost the transport reconnects
	// to the next address after the lost node at once (the lost node is
	// tried last), then retries every address with backoff; each time it
	// declares the topology again and its consumers resume. New's url may
	// also hold several URLs separated by commas (handy in one environment
	// variable). Defaults to none.
	URLs []string
	// QueueType is the type of every endpoint queue whose Queue.Type is
	// unset, and of its error queue: set endpoint.Quorum to run every
	// endpoint on quorum queues (replicated on a cluster). A quorum
	// endpoint queue also gets x-delivery-limit (DeliveryLimit), its error
	// queue as dead-letter target and at-least-once dead-lettering (see
	// docs/topology.md). Defaults to endpoint.Classic.
	QueueType endpoint.QueueType
	// DeliveryLimit is the x-delivery-limit of quorum endpoint queues: a
	// message returned to the queue (a requeue, or a consumer's connection
	// lost while it held it) more times than this is dead-lettered by the
	// broker into the endpoint's error queue (a poison message that crashes
	// its consumer). An endpoint's Queue.Args["x-delivery-limit"] wins.
	// Negative declares quorum queues bare, as before this field existed:
	// no delivery limit, dead-letter target or strategy (the broker's
	// default limit is unlimited on RabbitMQ 3.x but 20 on 4.x, where a
	// message over it is then dropped). Defaults to 20.
	DeliveryLimit int

	// TLS, when set, is used for amqps:// connections (client certificates
	// go in TLS.Certificates).
	TLS *tls.Config
	// ConnectTimeout bounds how long Start retries a broker that is down.
	// Defaults to 30s.
	ConnectTimeout time.Duration
	// ReconnectMaxInterval caps the backoff between reconnect attempts.
	// Defaults to 10s.
	ReconnectMaxInterval time.Duration
	// MaxPendingPublishes caps publishes awaiting a broker confirm; further
	// publishes wait. Defaults to 1000.
	MaxPendingPublishes int
	// PublishTimeout bounds the wait for a publish confirm. It also bounds
	// each socket write on the connection and each synchronous call on it
	// (a channel's open or close, enabling confirms, Qos, Consume, a
	// declare): a broker that leaves one unanswered that long,
	// as one in a resource alarm does, has the connection closed under it
	// and the transport reconnects. The outbox's RelayLease must be at
	// least twice it. Defaults to 30s, or half of RelayLease when that is
	// shorter.
	PublishTimeout time.Duration
	// Mandatory makes publishes that no queue receives fail with an error
	// instead of vanishing. Defaults to false for Publish (a message type
	// nobody consumes yet is not an error) and always on for Send.
	Mandatory bool
	// SuspectWindow is how long after a failure signal the broker's
	// publish confirms are not trusted. Failure signals of the connection,
	// for every destination: the connection lost or made again, a publish
	// channel closed under the transport, and Start itself when more than
	// one broker address is configured. A nack is a signal for its
	// destination (exchange and routing key) only. A message whose publish was sent within
	// SuspectWindow after the latest signal is sent again once the window
	// has passed (same message id: a duplicate when the first confirm was
	// true, which the receiving inbox absorbs). The outbox relay does not
	// mark such a row delivered: it releases it, without counting an
	// attempt, until the window is over; a direct Deliver (Publish without
	// the outbox, replies, dead letters) waits for the window and sends
	// again before it returns. Without a failure signal nothing changes.
	//
	// It was the defence against RabbitMQ 3.10 appearing to ack publishes
	// a leaderless quorum queue never held; those acks turned out to be
	// nacks that amqp091's NotifyPublish folds into a later multiple ack
	// (issue 31; docs/guarantees.md, known defects), which the transport
	// no longer reads. It is kept for extra caution on a broker you do not
	// trust, at the price of copies and latency after every failure
	// signal. Negative is an error. Defaults to 0 (off).
	SuspectWindow time.Duration
}

// Defaults for Config's zero fields.
const (
	DefaultConnectTimeout       = 30 * time.Second
	DefaultReconnectMaxInterval = 10 * time.Second
	DefaultMaxPendingPublishes  = 1000
	DefaultPublishTimeout       = 30 * time.Second
	DefaultDeliveryLimit        = 20
)

// ExchangeKind is a RabbitMQ exchange type.
type ExchangeKind string

// Exchange kinds.
const (
	DirectExchange  ExchangeKind = "direct"
	FanoutExchange  ExchangeKind = "fanout"
	TopicExchange   ExchangeKind = "topic"
	HeadersExchange ExchangeKind = "headers"
)

// Exchange declares an exchange. Exchanges are durable unless Transient.
type Exchange struct {
	Name       string
	Kind       ExchangeKind // Defaults to FanoutExchange.
	Transient  bool         // not durable: lost on broker restart
	AutoDelete bool
	Args       map[string]any
}

// Topology is a set of broker objects declared at start and after every
// reconnect. Declaring an object that exists with the same arguments is a
// no-op; different arguments are refused by the broker with a clear error.
type Topology struct {
	Exchanges []Exchange
	Queues    []endpoint.Queue
	Bindings  []endpoint.Binding
}

// DeclareExchange adds an exchange declaration.
func (t *Topology) DeclareExchange(x Exchange) { t.Exchanges = append(t.Exchanges, x) }

// DeclareQueue adds a queue declaration.
func (t *Topology) DeclareQueue(q endpoint.Queue) { t.Queues = append(t.Queues, q) }

// Bind adds a binding.
func (t *Topology) Bind(b endpoint.Binding) { t.Bindings = append(t.Bindings, b) }

func configErr(format string, args ...any) error {
	return fmt.Errorf("rabbitmq: "+format, args...)
}

// check reports every problem of c's settings; endpoint errors are in
// c.Errs.
func (c *Config) check() []error {
	var errs []error
	if c.ConnectTimeout < 0 {
		errs = append(errs, configErr("ConnectTimeout %v is negative", c.ConnectTimeout))
	}
	if c.ReconnectMaxInterval < 0 {
		errs = append(errs, configErr("ReconnectMaxInterval %v is negative", c.ReconnectMaxInterval))
	}
	if c.MaxPendingPublishes < 0 {
		errs = append(errs, configErr("MaxPendingPublishes %d is negative", c.MaxPendingPublishes))
	}
	if c.PublishTimeout < 0 {
		errs = append(errs, configErr("PublishTimeout %v is negative", c.PublishTimeout))
	}
	if c.SuspectWindow < 0 {
		errs = append(errs, configErr("SuspectWindow %v is negative; use 0 (off, the default) or a positive duration", c.SuspectWindow))
	}
	switch c.QueueType {
	case "", endpoint.Classic, endpoint.Quorum:
	default:
		errs = append(errs, configErr("QueueType %q: use endpoint.Classic or endpoint.Quorum (a stream is chosen per endpoint, in its Queue.Type)", c.QueueType))
	}
	for _, x := range c.Topology.Exchanges {
		switch x.Kind {
		case "", DirectExchange, FanoutExchange, TopicExchange, HeadersExchange:
		default:
			errs = append(errs, configErr("exchange %q: unknown kind %q", x.Name, x.Kind))
		}
		if x.Name == "" {
			errs = append(errs, configErr("an exchange has no name"))
		}
	}
	for _, b := range c.Topology.Bindings {
		if (b.Queue == "") == (b.ToExchange == "") {
			errs = append(errs, configErr("binding from %q: set exactly one of Queue and ToExchange", b.Exchange))
		}
	}
	return errs
}

// withDefaults returns c with its zero settings defaulted. relayLease,
// when positive, caps the default PublishTimeout at half of it.
func (c Config) withDefaults(relayLease time.Duration) Config {
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ReconnectMaxInterval == 0 {
		c.ReconnectMaxInterval = DefaultReconnectMaxInterval
	}
	if c.MaxPendingPublishes == 0 {
		c.MaxPendingPublishes = DefaultMaxPendingPublishes
	}
	if c.QueueType == "" {
		c.QueueType = endpoint.Classic
	}
	if c.DeliveryLimit == 0 {
		c.DeliveryLimit = DefaultDeliveryLimit
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
		if relayLease > 0 {
			c.PublishTimeout = min(DefaultPublishTimeout, relayLease/2)
		}
	}
	return c
}

// leaseCheck keeps the relay's lease at least twice the publish timeout:
// the relay may wait PublishTimeout for a batch's confirms before settling
// it, and a lease that expires first lets another relay claim and send the
// batch a second time.
func leaseCheck(relayLease, publishTimeout time.Duration) error {
	if relayLease <= 0 || publishTimeout <= 0 || relayLease >= 2*publishTimeout {
		return nil
	}
	return configErr("outbox RelayLease %v must be at least twice the RabbitMQ PublishTimeout %v (a relay waits up to PublishTimeout for confirms; a lease that expires first lets another relay send the batch again); raise RelayLease to %v or lower PublishTimeout to %v",
		relayLease, publishTimeout, 2*publishTimeout, relayLease/2)
}

var errNotBuilt = errors.New("rabbitmq: transport not built; hand it to bus.WithTransport, or call Build first")

var errBuilt = errors.New("rabbitmq: this transport is already started for a bus; call New for each bus")
