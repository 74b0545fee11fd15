package endpoint

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"
)

// InboxMode selects how an endpoint deduplicates messages.
type InboxMode int

const (
	// InboxTwoPhase (the default) takes a lock in its own short transaction,
	// then processes in a second transaction that marks the entry processed.
	// A long or crashed handler never blocks other deliveries of the same id
	// beyond InboxLockTimeout.
	InboxTwoPhase InboxMode = iota
	// InboxSingleTransaction inserts the inbox entry in the processing
	// transaction itself: one commit per message instead of two. Concurrent
	// deliveries of the same id wait on the row, so use it for short handlers.
	InboxSingleTransaction
	// InboxOff disables deduplication on this endpoint: every delivery runs
	// the consumer (at-least-once effect).
	InboxOff
)

// MissingIDPolicy says what an endpoint does with a message that has no id.
type MissingIDPolicy int

const (
	// RejectMissingID (the default) dead-letters the message with the reason:
	// without an id it cannot be deduplicated, and inventing one per delivery
	// would let every redelivery through.
	RejectMissingID MissingIDPolicy = iota
	// ProcessMissingID runs the consumer without deduplication and logs a warning.
	ProcessMissingID
)

// DefaultConcurrentMessageLimit is an endpoint's ConcurrentMessageLimit
// when it sets none; PrefetchCount defaults to the limit.
const DefaultConcurrentMessageLimit = 8

// Endpoint is a receive endpoint: a queue and the consumers that handle its
// messages, dispatched by message type. Configure it inside the function
// given to ReceiveEndpoint; it is read once, when the bus is built.
type Endpoint struct {
	name string

	// PrefetchCount is how many unacknowledged messages the broker may push
	// to the endpoint; must be >= ConcurrentMessageLimit. Defaults to
	// ConcurrentMessageLimit: one message per handler, so that a message
	// retried in process (its handler waiting out the backoff) holds no
	// other message behind it. A larger value saves a broker round trip
	// per message where handlers rarely retry. With group commit (Batch)
	// the endpoint holds BatchDeliveriesPerHandler times as many.
	PrefetchCount int
	// ConcurrentMessageLimit is how many messages the endpoint handles at
	// once. Defaults to 8. With group commit (Batch) it is how many
	// batches run at once, and the endpoint holds BatchDeliveriesPerHandler
	// deliveries per slot (that many more competing consumers, each with
	// the per-consumer prefetch PrefetchCount gives).
	ConcurrentMessageLimit int
	// Retry is the in-process retry policy. Defaults to DefaultRetry().
	Retry RetryPolicy
	// Redelivery lists second-level retries: when the in-process retries
	// are spent, the message is sent to the endpoint's queue again after
	// each delay in turn, and only then is dead-lettered. Permanent errors
	// skip it. The redelivery waits as an outbox row (durable, on every
	// transport; the original is acked once that row has committed), so a
	// delay is never early and may be late by up to the outbox's
	// PollingInterval. Defaults to none. Each delay must be at least 1ms.
	Redelivery []time.Duration
	// Serializer reads message bodies. Defaults to JSON.
	Serializer Serializer
	// Inbox selects deduplication. Defaults to InboxTwoPhase.
	Inbox InboxMode
	// Batch configures group commit of the two-phase inbox (see Batch).
	// Defaults to batches of up to 32 messages within 100ms.
	Batch Batch
	// MissingMessageID is the policy for messages without an id. Defaults
	// to RejectMissingID.
	MissingMessageID MissingIDPolicy
	// HandlerTimeout cancels a handler's context after this long; the
	// message then counts as failed. Defaults to 0 (no timeout).
	HandlerTimeout time.Duration
	// ErrorQueue receives dead letters when Queue.DeadLetterExchange is not
	// set. Defaults to "<name>_error".
	ErrorQueue string
	// Queue holds the broker-side declaration of the endpoint's queue (type,
	// TTL, dead-letter exchange, ...). Its Name is the endpoint's name.
	Queue Queue
	// Bindings are extra bindings of the endpoint's queue to exchanges, added
	// to the automatic binding of one exchange per consumed message type.
	Bindings []Binding

	consumers  []*Registration
	errs       []error
	partitions int // Ordered
}

// Name is the endpoint's (and its queue's) name.
func (e *Endpoint) Name() string { return e.name }

// Consumers returns the registered consumers in registration order.
func (e *Endpoint) Consumers() []*Registration { return e.consumers }

// MessageTypes lists the message types the endpoint's typed consumers handle.
func (e *Endpoint) MessageTypes() []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range e.consumers {
		if r.MessageType != "" && !seen[r.MessageType] {
			seen[r.MessageType] = true
			out = append(out, r.MessageType)
		}
	}
	return out
}

// Bind adds a binding of this endpoint's queue to exchange with routingKey.
func (e *Endpoint) Bind(exchange, routingKey string) {
	e.Bindings = append(e.Bindings, Binding{Exchange: exchange, Queue: e.name, RoutingKey: routingKey})
}

func (e *Endpoint) addErr(err error) { e.errs = append(e.errs, err) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)

// finish applies defaults and validates; it returns every problem found.
func (e *Endpoint) finish() []error {
	errs := append([]error(nil), e.errs...)
	bad := func(format string, args ...any) {
		errs = append(errs, configErr("endpoint %q: "+format, append([]any{e.name}, args...)...))
	}
	if e.ConcurrentMessageLimit == 0 {
		e.ConcurrentMessageLimit = DefaultConcurrentMessageLimit
	}
	if e.PrefetchCount == 0 {
		e.PrefetchCount = max(e.ConcurrentMessageLimit, 1)
	}
	if e.PrefetchCount < 0 {
		bad("PrefetchCount %d is negative", e.PrefetchCount)
	}
	if e.ConcurrentMessageLimit < 0 {
		bad("ConcurrentMessageLimit %d is negative", e.ConcurrentMessageLimit)
	}
	if e.PrefetchCount > 0 && e.ConcurrentMessageLimit > e.PrefetchCount {
		bad("ConcurrentMessageLimit %d exceeds PrefetchCount %d; raise PrefetchCount so every handler can hold a message", e.ConcurrentMessageLimit, e.PrefetchCount)
	}
	if e.Retry.Kind == 0 {
		e.Retry = DefaultRetry()
	}
	if err := e.Retry.Validate(); err != nil {
		bad("Retry: %v", err)
	}
	if e.Serializer == nil {
		e.Serializer = JSON
	}
	if e.Inbox < InboxTwoPhase || e.Inbox > InboxOff {
		bad("unknown Inbox mode %d", e.Inbox)
	}
	e.Batch.finish(e.ConcurrentMessageLimit, bad)
	if e.MissingMessageID < RejectMissingID || e.MissingMessageID > ProcessMissingID {
		bad("unknown MissingMessageID policy %d", e.MissingMessageID)
	}
	if e.HandlerTimeout < 0 {
		bad("HandlerTimeout %v is negative", e.HandlerTimeout)
	}
	for i, d := range e.Redelivery {
		if d < time.Millisecond || d > 7*24*time.Hour {
			bad("Redelivery[%d] = %v; each delay must be within 1ms–168h", i, d)
		}
	}
	if e.ErrorQueue == "" {
		e.ErrorQueue = e.name + "_error"
	}
	if e.ErrorQueue == e.name {
		bad("ErrorQueue must differ from the endpoint's own queue")
	}
	e.Queue.Name = e.name
	if e.Queue.MessageTTL < 0 || e.Queue.MaxLength < 0 || e.Queue.MaxLengthBytes < 0 {
		bad("Queue: MessageTTL, MaxLength and MaxLengthBytes must not be negative")
	}
	switch e.Queue.Overflow {
	case "", "drop-head", "reject-publish", "reject-publish-dlx":
	default:
		bad("Queue.Overflow %q: use drop-head, reject-publish or reject-publish-dlx", e.Queue.Overflow)
	}
	switch e.Queue.Type {
	case "", Classic, Quorum, Stream:
	default:
		bad("Queue.Type %q: use endpoint.Classic, endpoint.Quorum or endpoint.Stream", e.Queue.Type)
	}
	e.finishOrdering(bad)
	if len(e.consumers) == 0 {
		bad("no consumers; register one with endpoint.Consumer[T](e, fn)")
	}
	// Several consumers of one message type on one endpoint run one after
	// the other in the same transaction under one inbox entry; that must be
	// a deliberate choice, so each needs a distinct name given with Named.
	byType := map[string][]*Registration{}
	catchAll := 0
	for _, r := range e.consumers {
		if r.MessageType == "" {
			catchAll++
			continue
		}
		byType[r.MessageType] = append(byType[r.MessageType], r)
	}
	for _, typ := range sortedKeys(byType) {
		rs := byType[typ]
		if len(rs) < 2 {
			continue
		}
		names := map[string]bool{}
		for _, r := range rs {
			if !r.named || names[r.Name] {
				bad("message type %q is registered %d times; give each consumer a distinct name with endpoint.Named(...) (they then run in one transaction, in registration order) or move one to its own endpoint", typ, len(rs))
				break
			}
			names[r.Name] = true
		}
	}
	if catchAll > 1 {
		bad("%d raw catch-all consumers; at most one RawConsumer without endpoint.ForTypes is allowed", catchAll)
	}
	return errs
}

// Endpoints collects receive endpoint declarations. Every transport
// configurator embeds it, so a function that takes *Endpoints declares the
// same endpoints on any transport.
type Endpoints struct {
	list []*Endpoint
	errs []error
}

// ReceiveEndpoint declares an endpoint named name (also its queue's name) and
// configures it with configure.
func (c *Endpoints) ReceiveEndpoint(name string, configure func(e *Endpoint)) {
	if !nameRE.MatchString(name) {
		c.errs = append(c.errs, configErr("endpoint name %q: use 1-200 letters, digits, '.', '_', ':' or '-', starting with a letter or digit", name))
		return
	}
	for _, e := range c.list {
		if e.name == name {
			c.errs = append(c.errs, configErr("endpoint %q is declared twice; merge its consumers into one ReceiveEndpoint call", name))
			return
		}
	}
	if configure == nil {
		c.errs = append(c.errs, configErr("endpoint %q: configure function is nil", name))
		return
	}
	e := &Endpoint{name: name}
	if err := safeConfigure(e, configure); err != nil {
		c.errs = append(c.errs, err)
		return
	}
	c.errs = append(c.errs, e.finish()...)
	c.list = append(c.list, e)
}

func safeConfigure(e *Endpoint, configure func(*Endpoint)) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = configErr("endpoint %q: configure function panicked: %v", e.name, r)
		}
	}()
	configure(e)
	return nil
}

// List returns the declared endpoints.
func (c *Endpoints) List() []*Endpoint { return c.list }

// Errs returns the configuration errors collected so far.
func (c *Endpoints) Errs() []error { return c.errs }

// String helps error messages.
func (e *Endpoint) String() string { return fmt.Sprintf("endpoint %q", e.name) }

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
