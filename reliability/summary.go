//go:build linux

package reliability

import (
	"fmt"
	"strings"
	"time"
)

// Failures lists everything that makes the run fail: the checker's
// findings, dead letters, messages left in queues, a run that did not
// drain, and harness or process problems.
func (r *Result) Failures() []string {
	var out []string
	if r.Report == nil {
		return append(out, "no checker report")
	}
	out = append(out, r.Report.Failures()...)
	if !r.Drained {
		out = append(out, fmt.Sprintf("did not drain within %v (last: %s)", r.Profile.DrainTimeout, r.LastProgress))
	}
	if r.Poison != nil {
		// Dead letters are the poison classes' terminal state: the poison
		// checker matches each to its message (a good one is a failure).
		out = append(out, r.Poison.Failures()...)
	} else if len(r.Profile.Phases) > 0 {
		out = append(out, "no poison report")
	}
	for _, q := range sortedKeys(r.DeadLetters) {
		if n := r.DeadLetters[q]; n > 0 && r.Poison == nil {
			out = append(out, fmt.Sprintf("%d dead letters in %s", n, q))
		}
	}
	for _, q := range sortedKeys(r.Leftover) {
		if n := r.Leftover[q]; n > 0 {
			out = append(out, fmt.Sprintf("%d messages left in %s after the run", n, q))
		}
	}
	if r.Cluster != nil {
		out = append(out, r.Cluster.Failures()...)
	}
	out = append(out, r.Problems...)
	return out
}

// counter sums a counter over the processes.
func (r *Result) counter(name string) int64 {
	var n int64
	for _, p := range r.Procs {
		n += p.Counters[name]
	}
	return n
}

// SelfKills sums the relays' kill-after-confirm suicides.
func (r *Result) SelfKills() int {
	n := 0
	for _, p := range r.Procs {
		n += p.SelfKills
	}
	return n
}

// Fenced sums the late commits refused by inbox fencing.
func (r *Result) Fenced() int {
	n := 0
	for _, p := range r.Procs {
		n += p.Fenced
	}
	return n
}

// Summary is the human-readable outcome; its last line is the verdict.
func (r *Result) Summary() string {
	var b strings.Builder
	p := r.Profile
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	transport := p.Transport
	if transport == "" {
		transport = TransportRabbitMQ
	}
	line("== BareWire reliability, profile %s, transport %s ==", p.Name, transport)
	line("run %s (tables %s*): %d consumer + %d relay + 1 producer processes; %s in all (load %s, drain %s)",
		r.Names.Run, r.Names.Prefix, p.Consumers, p.Relays, r.Elapsed.Round(time.Second), r.Load.Round(time.Second), r.Drain.Round(time.Second))
	if transport == TransportPostgres {
		line("transport: PostgreSQL tables %squeue_messages/queues/bindings, Lease %s; publishes in transactions go straight to the queues (no outbox row, no relay)", r.Names.Prefix, p.Lease)
	}
	line("settings: InboxLockTimeout %s, RelayLease %s, handler delay %s, concurrency %d/endpoint, first-attempt failure ratio %.2f, rollback %.2f, republish %.2f, kill-after-confirm %.2f/batch",
		p.InboxLockTimeout, p.RelayLease, p.HandlerDelay, p.Concurrency, p.FailFirst, p.RollbackRatio, p.RepublishRatio, p.KillAfterConfirm)
	var faults []string
	for _, k := range []FaultKind{FaultConsumerKill, FaultRelayKill, FaultRelayStop, FaultProducerKill, FaultBrokerClose, FaultDBClose, FaultStopCont, FaultPGRestart, FaultNodeKill, FaultNodeStop} {
		if n := r.Faults[k]; n > 0 {
			s := fmt.Sprintf("%s %d", k, n)
			if k == FaultConsumerKill {
				s += fmt.Sprintf(" (%d with handlers in flight)", r.MidHandlerKills)
			}
			faults = append(faults, s)
		}
	}
	faults = append(faults, fmt.Sprintf("kill-after-confirm %d", r.SelfKills()),
		fmt.Sprintf("injected first-attempt failures %d", r.counter("injected_failures")))
	line("faults: %s", strings.Join(faults, ", "))
	for _, k := range sortedKeys(r.Skipped) {
		line("  not injected: %s: %s", k, r.Skipped[k])
	}
	restarts := 0
	for _, ps := range r.Procs {
		restarts += ps.Incarnations - 1
	}
	line("process restarts: %d", restarts)
	for _, n := range r.Notes {
		line("note: %s", n)
	}
	if rep := r.Report; rep != nil {
		line("checker: %d committed, %d rolled back, %d re-published (same message-id)", rep.Committed, rep.RolledBack, rep.Republished)
		for _, e := range append(append([]EffectCheck{}, rep.Effects...), rep.Followups...) {
			line("  %-40s %7d rows for %7d ids: missing %d, doubled %d, phantom %d", e.Name, e.Rows, e.Distinct, e.Missing, e.Doubled, e.Phantom)
		}
		if rep.DirectDelivery {
			line("  outbox: %d rows (want 0: every publish wrote its queue row in its own transaction)", rep.OutboxRows)
		} else {
			line("  outbox: %d delivered, %d pending (%d leased), %d parked; %d order rows (committed + re-published = %d); %d rows of rolled-back ids; max failed attempts %d",
				rep.OutboxDelivered, rep.OutboxPending, rep.OutboxLeased, rep.OutboxParked, rep.OutboxOrderRows, rep.Committed+rep.Republished, rep.OutboxRolledBack, rep.OutboxMaxAttempts)
		}
		line("  inbox: %d processed (want %d), %d unprocessed; %d re-attempts (retries, redeliveries, takeovers), max %d attempts",
			rep.InboxProcessed, 4*rep.Committed, rep.InboxUnprocessed, rep.InboxReattempts, rep.InboxMaxAttempts)
	}
	line("  consumers (lower bounds for killed processes): %d consumed, %d duplicates absorbed, %d retries, %d requeued, %d dead-lettered; %d late commits refused by inbox fencing",
		r.counter("consumed"), r.counter("duplicates"), r.counter("retries"), r.counter("requeued"), r.counter("dead_lettered"), r.Fenced())
	var dl, left int
	for _, n := range r.DeadLetters {
		dl += n
	}
	for _, n := range r.Leftover {
		left += n
	}
	where := "broker"
	if transport == TransportPostgres {
		where = "queue tables"
	}
	line("  %s: %d dead letters in error queues, %d messages left in endpoint queues", where, dl, left)
	if r.Cluster != nil {
		for _, l := range r.Cluster.Lines() {
			line("%s", l)
		}
	}
	for _, l := range r.PhaseLog {
		line("phase %s", l)
	}
	if r.Poison != nil {
		for _, l := range r.Poison.Lines() {
			line("%s", l)
		}
	}
	if f := r.Failures(); len(f) > 0 {
		for _, s := range f {
			line("  FAILURE: %s", s)
		}
		line("verdict: FAIL (%d problems)", len(f))
	} else {
		line("verdict: PASS: every committed message had exactly one effect per consumer and one follow-up each; nothing lost, doubled or published without commit")
		if r.Poison != nil {
			line("verdict: PASS (poison): every poison message reached its terminal state within %v with no effect; p99 ratio %.2f <= %.1f; 0 reconnects", r.Poison.Bounds.Terminal, r.Poison.Ratio, r.Poison.Bounds.P99Ratio)
		}
	}
	return b.String()
}
