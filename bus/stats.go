package bus

import (
	"context"
	"sync/atomic"
)

// Stats are counters since Start, for tests, samples and quick checks.
// Metrics for production come through OpenTelemetry; both count the same
// events (docs/observability.md says which metric each field matches).
type Stats struct {
	// Consumed counts messages whose consumers succeeded and committed.
	Consumed int64
	// Duplicates counts deliveries the inbox skipped as already processed.
	Duplicates int64
	// Retries counts failed attempts that were retried in process.
	Retries int64
	// Redelivered counts messages handed back for a delayed redelivery
	// (Endpoint.Redelivery).
	Redelivered int64
	// DeadLettered counts messages moved to a dead-letter destination.
	DeadLettered int64
	// DeadLettersReduced counts the dead letters (within DeadLettered) sent
	// without the received message's headers because the transport refused
	// them with them (BW-Fault-HeadersDropped).
	DeadLettersReduced int64
	// DeadLettersToOutbox counts the dead letters (within DeadLettered) the
	// transport refused even without those headers: each was written to the
	// outbox for the relay, which parks it after MaxAttempts.
	DeadLettersToOutbox int64
	// Requeued counts deliveries handed back to the broker when the bus
	// stopped before they reached a verdict (waiting for a busy inbox entry
	// or for the database, or retrying a dead letter the transport refused).
	Requeued int64
	// InFlight is how many messages the bus holds now: being handled, or
	// (group commit) taken and waiting for a worker of their endpoint.
	InFlight int64
	// ResponsesDropped counts responses dropped: ones that arrived after
	// their request had timed out or been cancelled, and ones this
	// instance could not deliver because the requester's reply queue was
	// gone (see docs/request-response.md).
	ResponsesDropped int64
	// Batches counts the transactions group commit (endpoint.Batch) ran:
	// one per batch a worker settled, a batch of one (the per-message
	// path, what a worker takes when nothing else waits) included; and
	// BatchedMessages the messages in them. BatchedMessages / Batches is
	// the mean batch: near 1 means group commit is not grouping (load too
	// low, or more workers, ConcurrentMessageLimit, than messages waiting).
	Batches, BatchedMessages int64
}

// counters is the observer behind Stats.
type counters struct {
	nopObserver
	consumed, duplicates, retries, redelivered, deadLettered, requeued, inFlight atomic.Int64
	responsesDropped                                                             atomic.Int64
	deadLettersReduced, deadLettersToOutbox                                      atomic.Int64
	batches, batchedMessages                                                     atomic.Int64
}

func (c *counters) started(ctx context.Context, _ *delivery) context.Context {
	c.inFlight.Add(1)
	return ctx
}

func (c *counters) retried(context.Context, *delivery) { c.retries.Add(1) }

func (c *counters) batched(_ string, n int) {
	c.batches.Add(1)
	c.batchedMessages.Add(int64(n))
}

func (c *counters) handled(_ context.Context, d *delivery) {
	switch d.outcome {
	case OutcomeCommitted:
		c.consumed.Add(1)
	case OutcomeDuplicate:
		c.duplicates.Add(1)
	case OutcomeRedelivery:
		c.redelivered.Add(1)
	case OutcomeDeadLettered:
		c.deadLettered.Add(1)
		switch d.deadLetterForm {
		case deadLetterReduced:
			c.deadLettersReduced.Add(1)
		case deadLetterOutbox:
			c.deadLettersToOutbox.Add(1)
		}
	case OutcomeRequeued:
		c.requeued.Add(1)
	}
	c.inFlight.Add(-1)
}

// Stats returns the counters.
func (b *Bus) Stats() Stats {
	return Stats{
		Consumed:            b.ctr.consumed.Load(),
		Duplicates:          b.ctr.duplicates.Load(),
		Retries:             b.ctr.retries.Load(),
		Redelivered:         b.ctr.redelivered.Load(),
		DeadLettered:        b.ctr.deadLettered.Load(),
		Requeued:            b.ctr.requeued.Load(),
		DeadLettersReduced:  b.ctr.deadLettersReduced.Load(),
		DeadLettersToOutbox: b.ctr.deadLettersToOutbox.Load(),
		InFlight:            b.ctr.inFlight.Load(),
		ResponsesDropped:    b.ctr.responsesDropped.Load(),
		Batches:             b.ctr.batches.Load(),
		BatchedMessages:     b.ctr.batchedMessages.Load(),
	}
}
