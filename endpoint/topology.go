package endpoint

import "time"

// ExchangeKind is a RabbitMQ exchange type.
type ExchangeKind string

// Exchange kinds.
const (
	DirectExchange  ExchangeKind = "direct"
	FanoutExchange  ExchangeKind = "fanout"
	TopicExchange   ExchangeKind = "topic"
	HeadersExchange ExchangeKind = "headers"
)

// QueueType is a RabbitMQ queue type.
type QueueType string

// Queue types. The zero value means classic.
const (
	Classic QueueType = "classic"
	Quorum  QueueType = "quorum"
	Stream  QueueType = "stream"
)

// Exchange declares an exchange. Exchanges are durable unless Transient.
type Exchange struct {
	Name       string
	Kind       ExchangeKind // Defaults to FanoutExchange.
	Transient  bool         // not durable: lost on broker restart
	AutoDelete bool
	Args       map[string]any
}

// Queue declares a queue. Queues are durable unless Transient.
type Queue struct {
	Name       string
	Type       QueueType // Defaults to Classic.
	Transient  bool
	AutoDelete bool
	// DeadLetterExchange receives rejected messages (x-dead-letter-exchange).
	// When empty, an endpoint dead-letters into its "<queue>_error" queue.
	DeadLetterExchange   string
	DeadLetterRoutingKey string
	MessageTTL           time.Duration // x-message-ttl; 0 means none
	MaxLength            int           // x-max-length; 0 means unlimited
	MaxLengthBytes       int           // x-max-length-bytes; 0 means unlimited
	// Overflow is "drop-head", "reject-publish" or "reject-publish-dlx".
	Overflow string
	Args     map[string]any
}

// Binding routes messages from an exchange to a queue or to another exchange.
type Binding struct {
	Exchange string // source exchange
	// Queue or ToExchange names the destination (exactly one of them).
	Queue      string
	ToExchange string
	RoutingKey string
	Args       map[string]any
}

// Topology is a set of broker objects declared at start and after every
// reconnect. Declaring an object that exists with the same arguments is a
// no-op; different arguments are refused by the broker with a clear error.
type Topology struct {
	Exchanges []Exchange
	Queues    []Queue
	Bindings  []Binding
}

// DeclareExchange adds an exchange declaration.
func (t *Topology) DeclareExchange(x Exchange) { t.Exchanges = append(t.Exchanges, x) }

// DeclareQueue adds a queue declaration.
func (t *Topology) DeclareQueue(q Queue) { t.Queues = append(t.Queues, q) }

// Bind adds a binding.
func (t *Topology) Bind(b Binding) { t.Bindings = append(t.Bindings, b) }
