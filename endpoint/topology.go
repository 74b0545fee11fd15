package endpoint

import "time"

// QueueType is a RabbitMQ queue type.
type QueueType string

// Queue types. The zero value means classic.
const (
	Classic QueueType = "classic"
	Quorum  QueueType = "quorum"
	Stream  QueueType = "stream"
)

// Queue declares a queue on a broker that has queue settings (RabbitMQ).
// Queues are durable unless Transient. On an endpoint (Endpoint.Queue) it
// describes the endpoint's own queue; transports without these settings
// (in-process, PostgreSQL) refuse an endpoint that sets any of them.
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

// IsZero reports whether q sets nothing beyond its name.
func (q Queue) IsZero() bool {
	return q.Type == "" && !q.Transient && !q.AutoDelete && q.DeadLetterExchange == "" &&
		q.DeadLetterRoutingKey == "" && q.MessageTTL == 0 && q.MaxLength == 0 &&
		q.MaxLengthBytes == 0 && q.Overflow == "" && len(q.Args) == 0
}

// Binding routes messages from an exchange to a queue or to another
// exchange. Every transport routes a binding to a queue; bindings between
// exchanges, routing keys and arguments mean something on RabbitMQ only.
type Binding struct {
	Exchange string // source exchange
	// Queue or ToExchange names the destination (exactly one of them).
	Queue      string
	ToExchange string
	RoutingKey string
	Args       map[string]any
}
