package bus

import "sync/atomic"

// Stats are counters since Start, for tests, samples and quick checks.
// Metrics for production come through OpenTelemetry.
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
	// Requeued counts deliveries handed back to the broker when the bus
	// stopped before they reached a verdict (waiting for a busy inbox entry
	// or for the database, or retrying a dead letter the transport refused).
	Requeued int64
	// InFlight is how many messages are being handled now.
	InFlight int64
}

type counters struct {
	consumed, duplicates, retries, redelivered, deadLettered, requeued atomic.Int64
}

// Stats returns the counters.
func (b *Bus) Stats() Stats {
	return Stats{
		Consumed:     b.ctr.consumed.Load(),
		Duplicates:   b.ctr.duplicates.Load(),
		Retries:      b.ctr.retries.Load(),
		Redelivered:  b.ctr.redelivered.Load(),
		DeadLettered: b.ctr.deadLettered.Load(),
		Requeued:     b.ctr.requeued.Load(),
		InFlight:     b.inFlight.Load(),
	}
}
