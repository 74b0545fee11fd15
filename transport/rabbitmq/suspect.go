package rabbitmq

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/barewire-go/barewire/outbox"
)

// The suspect window (Config.SuspectWindow, off by default). It was built
// when RabbitMQ 3.10.8 seemed to ack publishes that no quorum queue without
// a leader ever held (TestProbeQuorumLeaderLoss); read per publish, those
// acks were nacks amqp091's NotifyPublish folds into a later multiple ack
// (issue 31; docs/guarantees.md, known defects). When set, every failure
// signal of the connection (lost or made again, a publish channel closed
// under the transport, a cluster transport's start) opens a window of
// SuspectWindow in which no confirm is trusted, and a nack one in which no
// confirm of its destination is (issue 33: one full queue must not hold the
// whole outbox). A message whose publish was
// sent inside the window is sent once more after it: by the relay (a
// *outbox.RetryAfterError releases the row, uncounted, until the window
// ends) or by Deliver itself. Each failure signal costs each message at
// most one extra send; without one nothing changes.

// maxSuspectRounds bounds how often a direct Deliver waits out a window and
// sends again when failure signals keep coming; then it gives up with an
// error wrapping outbox.ErrTransportUnavailable.
const maxSuspectRounds = 3

// suspect records a failure signal of the connection: confirms of every
// publish sent from now until SuspectWindow has passed are not trusted.
func (t *Transport) suspect(reason string) {
	if t.cfg.SuspectWindow <= 0 {
		return
	}
	t.lastSignal.Store(int64(time.Since(t.epoch)) + 1)
	t.anySignal.Store(true)
	if t.log != nil {
		t.log.Debug("rabbitmq confirms not trusted for a while", slog.String("reason", reason),
			slog.Duration("suspect_window", t.cfg.SuspectWindow))
	}
}

// suspectDest records a nack from dest: confirms of publishes to dest sent
// from now until SuspectWindow has passed are not trusted. A destination
// that keeps nacking (a full reject-publish queue) holds only its own
// messages, never its neighbours'.
func (t *Transport) suspectDest(dest destination) {
	if t.cfg.SuspectWindow <= 0 {
		return
	}
	t.destSignals.Store(dest, int64(time.Since(t.epoch))+1)
	t.anySignal.Store(true)
}

// distrusted reports whether the confirm of j, sent at j.sent, is not
// trusted (sent before the end of the window of the connection's latest
// signal or of its destination's latest nack), and how long until that
// window ends (zero if it already has).
func (t *Transport) distrusted(j *job) (time.Duration, bool) {
	if t.cfg.SuspectWindow <= 0 {
		return 0, false
	}
	sig := t.lastSignal.Load()
	if v, ok := t.destSignals.Load(destination{j.exchange, j.key}); ok {
		sig = max(sig, v.(int64))
	}
	if sig == 0 {
		return 0, false
	}
	end := t.epoch.Add(time.Duration(sig-1) + t.cfg.SuspectWindow)
	if !j.sent.Before(end) {
		return 0, false
	}
	return max(time.Until(end), 0), true
}

// resendSuspects handles the confirmed jobs of one deliverOnce whose
// confirms fall in a suspect window: with a caller that handles
// *outbox.RetryAfterError (the relay), it returns that error for them;
// otherwise it waits for the window to end and sends them again, up to
// maxSuspectRounds times. idx maps jobs' message indexes to errs.
func (t *Transport) resendSuspects(ctx context.Context, msgs []*outbox.Message, mandatory bool, errs []error, jobs []*job, idx []int) {
	deferOK := outbox.RetryAfterAllowed(ctx)
	for round := 0; ; round++ {
		var again []*job
		var wait time.Duration
		for _, j := range jobs {
			if j.sent.IsZero() || errs[idx[j.i]] != nil {
				continue
			}
			if d, ok := t.distrusted(j); ok {
				again = append(again, j)
				wait = max(wait, d)
			}
		}
		if len(again) == 0 {
			return
		}
		if deferOK {
			for _, j := range again {
				errs[idx[j.i]] = &outbox.RetryAfterError{After: wait, Err: fmt.Errorf(
					"%w: rabbitmq: broker confirmed message %q within %v of a failure signal (a failover, a reconnect or a nack); not trusted until that window has passed",
					outbox.ErrTransportUnavailable, j.pub.MessageId, t.cfg.SuspectWindow)}
			}
			return
		}
		if round == maxSuspectRounds {
			for _, j := range again {
				errs[idx[j.i]] = fmt.Errorf("%w: rabbitmq: message %q: %d sends confirmed, each within %v of a failure signal; not trusted",
					outbox.ErrTransportUnavailable, j.pub.MessageId, round+1, t.cfg.SuspectWindow)
			}
			return
		}
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				for _, j := range again {
					errs[idx[j.i]] = fmt.Errorf("%w: rabbitmq: gave up waiting to send message %q again after a failure signal: %w",
						outbox.ErrTransportUnavailable, j.pub.MessageId, ctx.Err())
				}
				return
			case <-timer.C:
			}
		}
		sub := make([]*outbox.Message, len(again))
		subIdx := make([]int, len(again))
		for k, j := range again {
			sub[k] = msgs[idx[j.i]]
			subIdx[k] = idx[j.i]
		}
		subErrs, subJobs := t.deliverOnce(ctx, sub, mandatory)
		for k, e := range subErrs {
			errs[subIdx[k]] = e
		}
		jobs, idx = subJobs, subIdx
	}
}
