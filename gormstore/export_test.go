package gormstore

import "time"

// WatchStats are the commit watcher's counters.
type WatchStats = watchStats

// WatchStats reports the commit watcher's counters (zero on SQLite).
func (o *Outbox) WatchStats() WatchStats {
	if o.watch == nil {
		return WatchStats{}
	}
	return o.watch.stats()
}

// SetWatchTiming changes the commit watcher's timing; zero values keep the
// default. Call it before the first Add.
func (o *Outbox) SetWatchTiming(maxInterval, expiry time.Duration, maxPending int) {
	if maxInterval > 0 {
		o.watch.cfg.maxInterval = maxInterval
	}
	if expiry > 0 {
		o.watch.cfg.expiry = expiry
	}
	if maxPending > 0 {
		o.watch.cfg.maxPending = maxPending
	}
}
