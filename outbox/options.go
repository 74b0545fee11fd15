package outbox

import (
	"fmt"
	"time"
)

// Options configure the outbox, the inbox and their cleanup (one set, as in
// BareWire). Pass a function that edits them to bus.WithOutbox. Zero fields
// take the defaults written on each.
type Options struct {
	// PollingInterval is the relay's safety-net poll; commits wake it
	// sooner. Defaults to 1s.
	PollingInterval time.Duration
	// DispatchBatchSize is how many rows one relay claim takes, 1–10000.
	// Defaults to 100.
	DispatchBatchSize int
	// RelayWorkers is how many batches a relay keeps in flight. Defaults to 2.
	RelayWorkers int
	// RelayLease is how long a claimed batch stays reserved to its relay;
	// a relay that stops answering mid-batch loses it after this (a held
	// batch's transaction is ended by PostgreSQL; a lease expires). On RabbitMQ it must
	// be at least twice PublishTimeout (bus.New says so otherwise).
	// Defaults to 1m.
	RelayLease time.Duration
	// MaxAttempts parks a row after this many failed deliveries (an
	// unroutable or oversized message, say). Defaults to 10.
	MaxAttempts int
	// DeleteOnDeliver deletes rows once confirmed instead of keeping them
	// for OutboxRetention. Defaults to false.
	DeleteOnDeliver bool
	// OutboxRetention keeps delivered rows this long. Defaults to 7 days.
	OutboxRetention time.Duration
	// InboxLockTimeout is how long a delivery holds its inbox lock; a
	// crashed consumer's message is processed again after it. Defaults to 30s.
	InboxLockTimeout time.Duration
	// InboxRetention keeps processed inbox entries (and so deduplicates)
	// this long; it must exceed InboxLockTimeout and should exceed the
	// longest time a broker may redeliver a message. Defaults to 7 days.
	InboxRetention time.Duration
	// CleanupInterval is how often retention cleanup runs. Defaults to 1h.
	CleanupInterval time.Duration
	// CleanupBatchSize bounds each cleanup delete. Defaults to 1000.
	CleanupBatchSize int
	// TablePrefix prefixes the tables (inbox, outbox). Defaults to "barewire_".
	TablePrefix string
	// DisableAutoMigrate stops Start from creating or upgrading the tables;
	// apply the migration files (gormstore.Migrations, or
	// gormstore.MigrationSQL for another prefix) with your own tool. Start
	// then checks that the tables exist and fails naming any missing.
	DisableAutoMigrate bool
	// PublishThroughOutbox makes Publish and Send outside a transaction go
	// through the outbox in a transaction of their own instead of straight
	// to the transport. Defaults to false.
	PublishThroughOutbox bool
}

// Defaults fills zero fields with their defaults.
func (o *Options) Defaults() {
	setDur := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	setDur(&o.PollingInterval, DefaultPollingInterval)
	setDur(&o.RelayLease, DefaultLease)
	setDur(&o.OutboxRetention, DefaultRetention)
	setDur(&o.InboxLockTimeout, 30*time.Second)
	setDur(&o.InboxRetention, 7*24*time.Hour)
	setDur(&o.CleanupInterval, DefaultCleanupInterval)
	if o.DispatchBatchSize == 0 {
		o.DispatchBatchSize = DefaultDispatchBatchSize
	}
	if o.RelayWorkers == 0 {
		o.RelayWorkers = DefaultRelayWorkers
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.CleanupBatchSize == 0 {
		o.CleanupBatchSize = 1000
	}
	if o.TablePrefix == "" {
		o.TablePrefix = "barewire_"
	}
}

// Validate returns every problem with the (defaulted) options.
func (o *Options) Validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("outbox options: "+format, args...)) }
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"PollingInterval", o.PollingInterval}, {"RelayLease", o.RelayLease}, {"OutboxRetention", o.OutboxRetention},
		{"InboxLockTimeout", o.InboxLockTimeout}, {"InboxRetention", o.InboxRetention}, {"CleanupInterval", o.CleanupInterval},
	} {
		if d.v < 0 {
			bad("%s %v is negative", d.name, d.v)
		}
	}
	if o.DispatchBatchSize < 1 || o.DispatchBatchSize > 10000 {
		bad("DispatchBatchSize %d must be within 1–10000", o.DispatchBatchSize)
	}
	if o.RelayWorkers < 1 || o.RelayWorkers > 64 {
		bad("RelayWorkers %d must be within 1–64", o.RelayWorkers)
	}
	if o.MaxAttempts < 1 {
		bad("MaxAttempts %d must be at least 1", o.MaxAttempts)
	}
	if o.CleanupBatchSize < 1 {
		bad("CleanupBatchSize %d must be at least 1", o.CleanupBatchSize)
	}
	if o.InboxLockTimeout > 0 && o.InboxRetention <= o.InboxLockTimeout {
		bad("InboxRetention %v must be greater than InboxLockTimeout %v (otherwise a crashed delivery's lock could be deleted before its redelivery)", o.InboxRetention, o.InboxLockTimeout)
	}
	if o.PollingInterval > 0 && o.PollingInterval < time.Millisecond {
		bad("PollingInterval %v is below 1ms", o.PollingInterval)
	}
	return errs
}
