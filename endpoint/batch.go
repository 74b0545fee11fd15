package endpoint

import "time"

// Group commit defaults and bounds (Endpoint.Batch).
const (
	// DefaultBatchMaxMessages is Batch.MaxMessages when it is 0.
	DefaultBatchMaxMessages = 32
	// MaxBatchMessages bounds Batch.MaxMessages: each message of a batch
	// runs in a savepoint, a PostgreSQL subtransaction, and past 64 in one
	// transaction a backend's subtransaction cache overflows, which slows
	// every session's snapshots.
	MaxBatchMessages = 64
	// DefaultBatchMaxDuration is Batch.MaxDuration when it is 0.
	DefaultBatchMaxDuration = 100 * time.Millisecond
	// BatchDeliveriesPerHandler is how many deliveries an endpoint with
	// group commit holds per ConcurrentMessageLimit slot: a handler that
	// becomes free finds the others waiting and takes them as one batch.
	BatchDeliveriesPerHandler = 4
)

// Batch configures group commit on an endpoint with the two-phase inbox
// (the default): deliveries waiting when a handler becomes free are
// processed together: one statement locks their inbox entries, one
// transaction runs each message's consumers inside its own savepoint (a
// failing consumer is rolled back to it and retried, redelivered or
// dead-lettered on its own; its neighbours commit), one statement marks
// them processed, one COMMIT; the acks follow the commit. There is no
// waiting for a batch to fill: at low load a batch is one message, so
// latency is unchanged. docs/inbox.md describes it in full.
type Batch struct {
	// MaxMessages is the most messages one transaction takes. Defaults to
	// DefaultBatchMaxMessages (32), except on an endpoint whose
	// ConcurrentMessageLimit is 1, where it defaults to 1 so that the
	// endpoint keeps handling one message at a time in queue order (set it
	// above 1 there to batch anyway: the endpoint then holds
	// BatchDeliveriesPerHandler deliveries, and order is not kept); 1 turns
	// group commit off (one transaction per message). At most
	// MaxBatchMessages (64).
	MaxMessages int
	// MaxDuration bounds a batch's transaction: once it has run this long,
	// the messages whose consumers have not started yet go in the next
	// transaction (their inbox locks are kept), so one slow consumer does
	// not hold its neighbours' commits past it. A single consumer is bounded
	// by HandlerTimeout. Defaults to DefaultBatchMaxDuration (100ms).
	MaxDuration time.Duration
}

// BatchEnabled reports whether the endpoint group-commits: the two-phase inbox
// and MaxMessages above 1 (after defaults).
func (e *Endpoint) BatchEnabled() bool {
	return e.Inbox == InboxTwoPhase && e.Batch.MaxMessages > 1
}

func (b *Batch) finish(limit int, bad func(format string, args ...any)) {
	if b.MaxMessages == 0 {
		b.MaxMessages = DefaultBatchMaxMessages
		if limit == 1 {
			// One message at a time, in queue order, is what a limit of
			// 1 asks for; a batch would hold BatchDeliveriesPerHandler
			// deliveries and could run them out of order.
			b.MaxMessages = 1
		}
	}
	if b.MaxDuration == 0 {
		b.MaxDuration = DefaultBatchMaxDuration
	}
	if b.MaxMessages < 0 || b.MaxMessages > MaxBatchMessages {
		bad("Batch.MaxMessages %d: use 1 (no group commit) to %d", b.MaxMessages, MaxBatchMessages)
	}
	if b.MaxDuration < 0 {
		bad("Batch.MaxDuration %v is negative", b.MaxDuration)
	}
}
