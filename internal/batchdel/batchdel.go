package batchdel

import (
	"context"
	"log/slog"
	"time"
)

// Func deletes at most batch rows and returns how many it deleted.
type Func func(ctx context.Context, batch int) (int, error)

// Once calls del until a batch comes back short and returns the total.
func Once(ctx context.Context, batch int, del Func) (int, error) {
	if batch <= 0 {
		batch = 1000
	}
	total := 0
	for {
		n, err := del(ctx, batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		if ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}

// Loop runs Once every interval until ctx is done, logging failures as
// warnings under what ("inbox cleanup", ...).
func Loop(ctx context.Context, interval time.Duration, batch int, del Func, log *slog.Logger, what string, clk Clock) {
	if log == nil {
		log = slog.Default()
	}
	now := time.Now
	if clk != nil {
		now = clk.Now
	}
	next := now().Add(interval)
	for {
		var advanced <-chan struct{}
		if clk != nil {
			advanced = clk.Advanced()
		}
		t := time.NewTimer(max(next.Sub(now()), 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-advanced:
			t.Stop()
			if now().Before(next) {
				continue
			}
		case <-t.C:
		}
		n, err := Once(ctx, batch, del)
		if err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, what+" failed; retrying next interval", "error", err, "deleted", n)
		} else if n > 0 {
			log.DebugContext(ctx, what, "deleted", n)
		}
		next = now().Add(interval)
	}
}

// Clock is a controllable time source (tests only): Loop times its
// interval by it and re-checks whenever it advances.
type Clock interface {
	Now() time.Time
	Advanced() <-chan struct{}
}
