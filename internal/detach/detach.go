// Package detach gives the cleanup a canceled operation must still do (a
// ROLLBACK, an inbox lock released, a redelivery or dead letter settled)
// a context of its own: it keeps the values of the operation's context,
// is not canceled with it, and ends after a bound, so that it never waits
// for ever on a database or broker that stopped answering.
package detach

import (
	"context"
	"time"
)

// Timeout bounds one detached step. A step that takes longer fails like
// any failed statement; the loops around settlements try again.
const Timeout = 10 * time.Second

// From returns ctx's values in a context that outlives ctx's cancellation
// and ends after Timeout.
func From(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), Timeout)
}
