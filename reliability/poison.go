package reliability

import (
	"fmt"
	"strings"
	"time"

	"github.com/barewire-go/barewire/reliability/workload"
)

// PoisonBounds are the poison profile's limits.
type PoisonBounds struct {
	// Terminal bounds the time from a poison message's publish to its
	// terminal state.
	Terminal time.Duration
	// P99Ratio bounds good traffic's p99 latency during the poison phase
	// against the mean of the baselines' p99s.
	P99Ratio float64
	// P99Allowance, when positive, is a wait a good message may have on
	// top of the baselines' mean whatever the ratio: a transport's known,
	// bounded head-of-line wait behind a retrying poison message, which
	// does not shrink when the machine is fast (the ratio alone then
	// fails a quiet run and passes a busy one).
	P99Allowance time.Duration
}

// p99Exceeded reports whether r's poison-phase p99 is past its bounds.
func (r *PoisonReport) p99Exceeded() bool {
	if r.Ratio <= r.Bounds.P99Ratio {
		return false
	}
	return r.Bounds.P99Allowance <= 0 || r.PoisonP99 > r.BaselineP99+r.Bounds.P99Allowance
}

// PoisonSent is one row of the poison table: a poison message the
// producer sent (outcome "sent") or whose publish was refused ("refused").
type PoisonSent struct {
	Key, Class, Outcome, Error string
	// MessageID is the id when PostgreSQL can store it as text.
	MessageID string
	SentAt    time.Time
}

// DeadLetter is one message found in an error queue after the run.
type DeadLetter struct {
	Queue string
	// Key is its workload.HeaderPoisonKey ("" for a good message).
	Key, MessageID, Reason, Endpoint string
	Attempts                         int
	// At is its BW-Fault-Time (zero when missing or unparsable).
	At time.Time
}

// Parked is a poison message's outbox row parked by the relay.
type Parked struct {
	Reason string
	At     time.Time
}

// PhaseLatency is good traffic's end-to-end latency in one phase: from
// the producer's insert to each order endpoint's effect.
type PhaseLatency struct {
	Phase   string
	Samples int64
	// P50 is reported only; P99 is judged.
	P50, P99 time.Duration
	// Slowest lists the phase's slowest effects, slowest first (reported
	// only: when the p99 bound fails, what was slow and when).
	Slowest []SlowEffect
}

// SlowEffect is one slow good effect: its message's insert time, the
// endpoint and process that applied it, on which attempt, and its latency.
type SlowEffect struct {
	MessageID, Endpoint, Instance string
	Attempt                       int
	Produced                      time.Time
	Latency                       time.Duration
}

// PoisonObservations is everything the poison checker judges, read from
// the run's tables, error queues and process counters (see checkPoison);
// EvaluatePoison is a pure function of it, so that the checker's unit
// tests can feed it fabricated outcomes.
type PoisonObservations struct {
	Classes     []workload.PoisonSpec
	Sent        []PoisonSent
	DeadLetters []DeadLetter
	// Parked maps poison keys to their parked outbox rows.
	Parked map[string]Parked
	// Effects maps poison keys to the effect rows their ids have.
	Effects map[string]int
	// Latency lists the phases; PoisonPhase names the poison one, every
	// other is a baseline.
	Latency     []PhaseLatency
	PoisonPhase string
	// Reconnects sums the processes' lost transport connections.
	Reconnects int64
	// End is when the run was checked: an unfinished message's age then
	// is at least how long it took.
	End    time.Time
	Bounds PoisonBounds
}

// ClassResult is the verdict on one poison class.
type ClassResult struct {
	Class    workload.PoisonClass
	Terminal string
	// Sent counts messages sent or refused; Reached those in their
	// terminal state.
	Sent, Reached int
	// Slowest is the longest time to the terminal state (to the check, for
	// a message that never reached it).
	Slowest time.Duration
	// NotTerminal, TooSlow, WrongReason, Retried (a Permanent failure with
	// more than one attempt), Accepted (a publish that had to be refused)
	// and Effects (effect rows of poison ids) count violations.
	NotTerminal, TooSlow, WrongReason, Retried, Accepted, Effects int
	Samples                                                       []string
}

// PoisonReport is the poison checker's verdict.
type PoisonReport struct {
	Bounds  PoisonBounds
	Classes []ClassResult
	// GoodDeadLetters counts dead letters of good messages (no poison key);
	// StrayDeadLetters those whose key matches no poison row.
	GoodDeadLetters, StrayDeadLetters int
	Latency                           []PhaseLatency
	// BaselineP99 is the mean of the baselines' p99s; Ratio the poison
	// phase's p99 over it (0 when a phase has no samples).
	BaselineP99, PoisonP99 time.Duration
	Ratio                  float64
	// NoLatency lists phases without a single processed good message.
	NoLatency  []string
	Reconnects int64
}

// EvaluatePoison judges o.
func EvaluatePoison(o PoisonObservations) *PoisonReport {
	rep := &PoisonReport{Bounds: o.Bounds, Latency: o.Latency, Reconnects: o.Reconnects}
	byKey := map[string]PoisonSent{}
	for _, s := range o.Sent {
		byKey[s.Key] = s
	}
	dls := map[string][]DeadLetter{}
	for _, d := range o.DeadLetters {
		switch _, known := byKey[d.Key]; {
		case d.Key == "":
			rep.GoodDeadLetters++
		case !known:
			rep.StrayDeadLetters++
		default:
			dls[d.Key] = append(dls[d.Key], d)
		}
	}
	for _, spec := range o.Classes {
		cr := ClassResult{Class: spec.Class, Terminal: spec.Terminal}
		sample := func(format string, args ...any) {
			if len(cr.Samples) < 3 {
				cr.Samples = append(cr.Samples, fmt.Sprintf(format, args...))
			}
		}
		for _, s := range o.Sent {
			if s.Class != string(spec.Class) {
				continue
			}
			cr.Sent++
			if n := o.Effects[s.Key]; n > 0 {
				cr.Effects += n
				sample("%s: %d effect rows", s.Key, n)
			}
			reached, at := false, time.Time{}
			switch spec.Terminal {
			case workload.TerminalRefused, workload.TerminalRefusedOrParked:
				if s.Outcome == "refused" {
					reached, at = true, s.SentAt
					break
				}
				if pk, ok := o.Parked[s.Key]; ok && spec.Terminal == workload.TerminalRefusedOrParked && pk.Reason != "" {
					reached, at = true, pk.At
					break
				}
				if spec.Terminal == workload.TerminalRefused {
					// Its own verdict, not also a missing terminal state.
					cr.Accepted++
					sample("%s: accepted at publish", s.Key)
					continue
				}
			case workload.TerminalDeadLetter:
				got := dls[s.Key]
				endpoints := map[string]bool{}
				for _, d := range got {
					endpoints[d.Queue] = true
					if !spec.ReasonOK(d.Reason) {
						cr.WrongReason++
						sample("%s in %s: reason %q", s.Key, d.Queue, clip(d.Reason, 120))
					}
					// 0: refused before any consumer ran (a bad inbound id).
					if spec.Permanent && d.Attempts > 1 {
						cr.Retried++
						sample("%s in %s: %d attempts for a permanent failure", s.Key, d.Queue, d.Attempts)
					}
					if d.At.After(at) {
						at = d.At
					}
				}
				reached = len(endpoints) >= spec.Endpoints && !at.IsZero()
			}
			if !reached {
				cr.NotTerminal++
				sample("%s: not %s", s.Key, spec.Terminal)
				at = o.End
			} else {
				cr.Reached++
			}
			took := at.Sub(s.SentAt)
			if took > cr.Slowest {
				cr.Slowest = took
			}
			if reached && took > o.Bounds.Terminal {
				cr.TooSlow++
				sample("%s: %s after %v", s.Key, spec.Terminal, took.Round(time.Millisecond))
			}
		}
		rep.Classes = append(rep.Classes, cr)
	}
	var base []time.Duration
	for _, l := range o.Latency {
		switch {
		case l.Samples == 0 || l.P99 <= 0:
			rep.NoLatency = append(rep.NoLatency, l.Phase)
		case l.Phase == o.PoisonPhase:
			rep.PoisonP99 = l.P99
		default:
			base = append(base, l.P99)
		}
	}
	if len(base) > 0 {
		var sum time.Duration
		for _, d := range base {
			sum += d
		}
		rep.BaselineP99 = sum / time.Duration(len(base))
	}
	if rep.BaselineP99 > 0 {
		rep.Ratio = float64(rep.PoisonP99) / float64(rep.BaselineP99)
	}
	return rep
}

// Failures lists every violated poison verdict; empty means the poison
// run is clean.
func (r *PoisonReport) Failures() []string {
	var out []string
	for _, c := range r.Classes {
		ex := ""
		if len(c.Samples) > 0 {
			ex = "; e.g. " + strings.Join(c.Samples, "; ")
		}
		switch {
		case c.Sent == 0:
			out = append(out, fmt.Sprintf("poison %s: no message of the class was sent", c.Class))
		case c.NotTerminal > 0:
			out = append(out, fmt.Sprintf("poison %s: %d of %d messages never reached their terminal state (%s)%s", c.Class, c.NotTerminal, c.Sent, c.Terminal, ex))
		}
		if c.TooSlow > 0 {
			out = append(out, fmt.Sprintf("poison %s: %d messages took longer than %v to be %s (slowest %v)%s", c.Class, c.TooSlow, r.Bounds.Terminal, c.Terminal, c.Slowest.Round(time.Millisecond), ex))
		}
		if c.WrongReason > 0 {
			out = append(out, fmt.Sprintf("poison %s: %d dead letters without the expected BW-Fault-Reason%s", c.Class, c.WrongReason, ex))
		}
		if c.Retried > 0 {
			out = append(out, fmt.Sprintf("poison %s: %d dead letters of a permanent failure after more than one attempt%s", c.Class, c.Retried, ex))
		}
		if c.Accepted > 0 {
			out = append(out, fmt.Sprintf("poison %s: %d of %d publishes accepted; they must be refused with an error%s", c.Class, c.Accepted, c.Sent, ex))
		}
		if c.Effects > 0 {
			out = append(out, fmt.Sprintf("poison %s: %d business effects committed%s", c.Class, c.Effects, ex))
		}
	}
	if r.GoodDeadLetters > 0 {
		out = append(out, fmt.Sprintf("poison: %d good messages dead-lettered", r.GoodDeadLetters))
	}
	if r.StrayDeadLetters > 0 {
		out = append(out, fmt.Sprintf("poison: %d dead letters with a poison key the producer never recorded", r.StrayDeadLetters))
	}
	switch {
	case len(r.NoLatency) > 0 || r.BaselineP99 <= 0 || r.PoisonP99 <= 0:
		out = append(out, fmt.Sprintf("poison: no latency samples (no good message processed) in phases %s", strings.Join(r.NoLatency, ", ")))
	case r.p99Exceeded():
		out = append(out, fmt.Sprintf("poison: good traffic's p99 during poison is %v, %.2fx the baselines' mean %v (bound %.1fx%s)",
			r.PoisonP99.Round(time.Millisecond), r.Ratio, r.BaselineP99.Round(time.Millisecond), r.Bounds.P99Ratio, allowance(r.Bounds)))
	}
	if r.Reconnects > 0 {
		out = append(out, fmt.Sprintf("poison: %d transport reconnects in the processes; want 0", r.Reconnects))
	}
	return out
}

// Lines is the report for the summary.
func (r *PoisonReport) Lines() []string {
	var out []string
	out = append(out, fmt.Sprintf("poison: terminal bound %v, p99 bound %.1fx%s", r.Bounds.Terminal, r.Bounds.P99Ratio, allowance(r.Bounds)))
	for _, c := range r.Classes {
		out = append(out, fmt.Sprintf("  %-24s %4d sent, %4d %-44s slowest %8v; effects %d",
			c.Class, c.Sent, c.Reached, c.Terminal+",", c.Slowest.Round(time.Millisecond), c.Effects))
	}
	for _, l := range r.Latency {
		out = append(out, fmt.Sprintf("  good latency %-12s p50 %8v, p99 %8v over %d effects", l.Phase, l.P50.Round(time.Millisecond), l.P99.Round(time.Millisecond), l.Samples))
		if len(l.Slowest) > 0 {
			var slow []string
			for _, e := range l.Slowest {
				slow = append(slow, fmt.Sprintf("%s %v %s@%s#%d", e.Produced.UTC().Format("15:04:05.000"), e.Latency.Round(time.Millisecond), e.Endpoint, e.Instance, e.Attempt))
			}
			out = append(out, "    slowest (inserted, latency, endpoint@process#attempt): "+strings.Join(slow, "; "))
		}
	}
	out = append(out, fmt.Sprintf("  p99 ratio %.2f (poison %v / baselines' mean %v); good dead-lettered %d; reconnects %d",
		r.Ratio, r.PoisonP99.Round(time.Millisecond), r.BaselineP99.Round(time.Millisecond), r.GoodDeadLetters, r.Reconnects))
	return out
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// allowance describes b's P99Allowance for the report.
func allowance(b PoisonBounds) string {
	if b.P99Allowance <= 0 {
		return ""
	}
	return fmt.Sprintf(" or the baselines' mean + %v", b.P99Allowance)
}
