package inbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/barewire-go/barewire/internal/batchdel"
)

// Cleaner deletes processed inbox entries older than Retention every
// Interval, in batches of Batch, until a batch comes back short. Several
// instances may run it at once: the store's batches skip rows another
// instance is deleting.
type Cleaner struct {
	Store     Store
	Retention time.Duration
	Interval  time.Duration
	// Batch defaults to 1000.
	Batch  int
	Logger *slog.Logger
	// Clock, when set, times the interval (a test's fake clock): an
	// advance past the next pass runs it at once. Nil: the real clock.
	Clock Clock
}

// Run cleans until ctx is done. The first pass runs after one Interval.
func (c *Cleaner) Run(ctx context.Context) {
	batchdel.Loop(ctx, c.Interval, c.Batch, c.del, c.Logger, "inbox cleanup", c.Clock)
}

// Once runs one cleanup pass and returns how many entries it deleted.
func (c *Cleaner) Once(ctx context.Context) (int, error) {
	return batchdel.Once(ctx, c.Batch, c.del)
}

func (c *Cleaner) del(ctx context.Context, batch int) (int, error) {
	return c.Store.Cleanup(ctx, c.Retention, batch)
}
