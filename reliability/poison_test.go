package reliability_test

import (
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/reliability"
	"github.com/barewire-go/barewire/reliability/workload"
)

// cleanPoison returns observations of a clean poison run: one message per
// class of the RabbitMQ transport, each in its terminal state one second
// after it was sent, no effect, p99 ratio 1.5, no reconnect.
func cleanPoison() reliability.PoisonObservations {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := reliability.PoisonObservations{
		Classes: workload.PoisonClasses("rabbitmq"),
		Parked:  map[string]reliability.Parked{},
		Effects: map[string]int{},
		Latency: []reliability.PhaseLatency{
			{Phase: "baseline-1", Samples: 100, P99: 100 * time.Millisecond},
			{Phase: "poison", Samples: 100, P99: 150 * time.Millisecond},
			{Phase: "baseline-2", Samples: 100, P99: 100 * time.Millisecond},
		},
		PoisonPhase: "poison",
		End:         t0.Add(time.Minute),
		Bounds:      reliability.PoisonBounds{Terminal: 30 * time.Second, P99Ratio: 2},
	}
	for _, s := range o.Classes {
		key := string(s.Class)
		sent := reliability.PoisonSent{Key: key, Class: key, Outcome: "sent", MessageID: "id-" + key, SentAt: t0}
		switch s.Terminal {
		case workload.TerminalRefused, workload.TerminalRefusedOrParked:
			sent.Outcome, sent.Error = "refused", "bus: invalid message: too long"
		case workload.TerminalDeadLetter:
			for i := range s.Endpoints {
				o.DeadLetters = append(o.DeadLetters, reliability.DeadLetter{
					Queue: []string{"ledger_error", "notify_error"}[i], Key: key,
					Reason: s.Reasons[0], Attempts: 1, At: t0.Add(time.Second),
				})
			}
		}
		o.Sent = append(o.Sent, sent)
	}
	return o
}

// TestPoisonCheckerClean: the fabricated clean run passes, so that every
// failure below is the one mutation's.
func TestPoisonCheckerClean(t *testing.T) {
	rep := reliability.EvaluatePoison(cleanPoison())
	if f := rep.Failures(); len(f) != 0 {
		t.Fatalf("a clean poison run failed:\n%s", strings.Join(f, "\n"))
	}
	if rep.Ratio != 1.5 {
		t.Errorf("ratio = %v; want 1.5", rep.Ratio)
	}
	for _, c := range rep.Classes {
		if c.Sent != 1 || c.Reached != 1 {
			t.Errorf("%s: sent %d, reached %d; want 1, 1", c.Class, c.Sent, c.Reached)
		}
	}
}

// TestPoisonCheckerDetectsViolations feeds the poison checker one bad
// outcome per verdict and checks that each fails the run, by name.
func TestPoisonCheckerDetectsViolations(t *testing.T) {
	dropDeadLetters := func(class workload.PoisonClass) func(*reliability.PoisonObservations) {
		return func(o *reliability.PoisonObservations) {
			var keep []reliability.DeadLetter
			for _, d := range o.DeadLetters {
				if d.Key != string(class) {
					keep = append(keep, d)
				}
			}
			o.DeadLetters = keep
		}
	}
	editDeadLetter := func(class workload.PoisonClass, edit func(*reliability.DeadLetter)) func(*reliability.PoisonObservations) {
		return func(o *reliability.PoisonObservations) {
			for i := range o.DeadLetters {
				if o.DeadLetters[i].Key == string(class) {
					edit(&o.DeadLetters[i])
				}
			}
		}
	}
	editSent := func(class workload.PoisonClass, edit func(*reliability.PoisonSent)) func(*reliability.PoisonObservations) {
		return func(o *reliability.PoisonObservations) {
			for i := range o.Sent {
				if o.Sent[i].Class == string(class) {
					edit(&o.Sent[i])
				}
			}
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*reliability.PoisonObservations)
		want   string
	}{
		{"never dead-lettered (the DeadlineExceeded requeue loop)", dropDeadLetters(workload.PoisonErrDeadline),
			"poison err-deadline: 1 of 1 messages never reached their terminal state (dead-lettered)"},
		{"dead-lettered by one of two endpoints", func(o *reliability.PoisonObservations) {
			dropDeadLetters(workload.PoisonPanic)(o)
			o.DeadLetters = append(o.DeadLetters, reliability.DeadLetter{Queue: "ledger_error", Key: string(workload.PoisonPanic), Reason: "consumer panicked: x", Attempts: 4, At: o.End.Add(-time.Minute)})
		}, "poison panic: 1 of 1 messages never reached their terminal state"},
		{"dead-lettered after the bound", editDeadLetter(workload.PoisonAbortedTx, func(d *reliability.DeadLetter) { d.At = d.At.Add(45 * time.Second) }),
			"poison aborted-tx: 1 messages took longer than 30s to be dead-lettered"},
		{"dead-lettered with the wrong reason", editDeadLetter(workload.PoisonErrURL, func(d *reliability.DeadLetter) { d.Reason = "database unavailable" }),
			"poison err-url: 2 dead letters without the expected BW-Fault-Reason"},
		{"a permanent failure retried", editDeadLetter(workload.PoisonPermDeadline, func(d *reliability.DeadLetter) { d.Attempts = 4 }),
			"poison perm-deadline: 2 dead letters of a permanent failure after more than one attempt"},
		{"an oversized correlation id accepted at publish", editSent(workload.PoisonPubLongCorrelation, func(s *reliability.PoisonSent) { s.Outcome, s.Error = "sent", "" }),
			"poison pub-long-correlation-id: 1 of 1 publishes accepted; they must be refused"},
		{"a send to a missing queue neither refused nor parked", editSent(workload.PoisonSendMissingQueue, func(s *reliability.PoisonSent) { s.Outcome = "sent" }),
			"poison send-missing-queue: 1 of 1 messages never reached their terminal state"},
		{"a business effect of poison", func(o *reliability.PoisonObservations) { o.Effects[string(workload.PoisonErrPlain)] = 1 },
			"poison err-plain: 1 business effects committed"},
		{"a class never sent", func(o *reliability.PoisonObservations) {
			editSent(workload.PoisonRawNULID, func(s *reliability.PoisonSent) { s.Class = "other" })(o)
		}, "poison raw-nul-id: no message of the class was sent"},
		{"a good message dead-lettered", func(o *reliability.PoisonObservations) {
			o.DeadLetters = append(o.DeadLetters, reliability.DeadLetter{Queue: "ledger_error", MessageID: "good-1", Reason: "database unavailable", Attempts: 1, At: o.End})
		}, "poison: 1 good messages dead-lettered"},
		{"p99 over the bound", func(o *reliability.PoisonObservations) { o.Latency[1].P99 = 250 * time.Millisecond },
			"good traffic's p99 during poison is 250ms, 2.50x the baselines' mean 100ms (bound 2.0x)"},
		{"p99 over the ratio and the allowance", func(o *reliability.PoisonObservations) {
			o.Bounds.P99Allowance = time.Second
			o.Latency[1].P99 = 1200 * time.Millisecond
		}, "good traffic's p99 during poison is 1.2s, 12.00x the baselines' mean 100ms (bound 2.0x or the baselines' mean + 1s)"},
		{"no latency samples in the poison phase", func(o *reliability.PoisonObservations) { o.Latency[1] = reliability.PhaseLatency{Phase: "poison"} },
			"poison: no latency samples (no good message processed) in phases poison"},
		{"no latency samples in a baseline (the bus stalled for good)", func(o *reliability.PoisonObservations) {
			o.Latency[2] = reliability.PhaseLatency{Phase: "baseline-2"}
		}, "poison: no latency samples (no good message processed) in phases baseline-2"},
		{"a reconnect", func(o *reliability.PoisonObservations) { o.Reconnects = 1 },
			"poison: 1 transport reconnects in the processes; want 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := cleanPoison()
			tc.mutate(&o)
			f := strings.Join(reliability.EvaluatePoison(o).Failures(), "\n")
			if !strings.Contains(f, tc.want) {
				t.Errorf("failures lack %q:\n%s", tc.want, f)
			}
		})
	}
}

// TestPoisonAllowance: a p99 over the ratio but within the baselines' mean
// plus P99Allowance passes (a preset's bounded head-of-line wait on a fast
// machine); without an allowance the same p99 fails.
func TestPoisonAllowance(t *testing.T) {
	o := cleanPoison()
	o.Latency[1].P99 = 900 * time.Millisecond // 9x the baselines' 100ms
	if f := reliability.EvaluatePoison(o).Failures(); len(f) == 0 {
		t.Fatal("9x the baselines passed a 2x bound without an allowance")
	}
	o.Bounds.P99Allowance = time.Second
	if f := reliability.EvaluatePoison(o).Failures(); len(f) != 0 {
		t.Fatalf("within the allowance, failures: %v", f)
	}
}

// TestPoisonCheckerParked: a send to a missing queue that the relay parks
// with its reason (RabbitMQ finds out only at relay time) is terminal;
// parked without a reason is not.
func TestPoisonCheckerParked(t *testing.T) {
	o := cleanPoison()
	for i := range o.Sent {
		if o.Sent[i].Class == string(workload.PoisonSendMissingQueue) {
			o.Sent[i].Outcome = "sent"
			o.Parked[o.Sent[i].Key] = reliability.Parked{Reason: "NO_ROUTE", At: o.Sent[i].SentAt.Add(5 * time.Second)}
		}
	}
	if f := reliability.EvaluatePoison(o).Failures(); len(f) != 0 {
		t.Fatalf("a parked send to a missing queue failed: %q", f)
	}
	for k := range o.Parked {
		o.Parked[k] = reliability.Parked{At: o.End}
	}
	if f := strings.Join(reliability.EvaluatePoison(o).Failures(), "\n"); !strings.Contains(f, "send-missing-queue: 1 of 1 messages never reached") {
		t.Fatalf("a parked row without a reason passed: %q", f)
	}
}

// TestPoisonReportListsSlowest: the report names each phase's slowest
// effects (insert time, latency, endpoint, process, attempt), so that a
// failed p99 bound says what was slow and when.
func TestPoisonReportListsSlowest(t *testing.T) {
	o := cleanPoison()
	at := time.Date(2026, 1, 1, 12, 0, 5, 250_000_000, time.UTC)
	o.Latency[1].Slowest = []reliability.SlowEffect{
		{MessageID: "m-1", Endpoint: "ledger", Instance: "consumer-2", Attempt: 1, Produced: at, Latency: 705 * time.Millisecond},
	}
	lines := strings.Join(reliability.EvaluatePoison(o).Lines(), "\n")
	if want := "12:00:05.250 705ms ledger@consumer-2#1"; !strings.Contains(lines, want) {
		t.Errorf("report lacks %q:\n%s", want, lines)
	}
	if strings.Count(lines, "slowest (inserted") != 1 {
		t.Errorf("want one slowest line (only the phase that has some):\n%s", lines)
	}
}

// TestPoisonBoundsPerPreset: poison-short judges good traffic's p99 at 5x
// the baselines' mean, 12x on the push-subscription presets (wmnats,
// wmredis), whose handlers can hold a good message behind a retrying
// poison one (docs/guarantees.md, the Watermill presets).
func TestPoisonBoundsPerPreset(t *testing.T) {
	want := map[string]float64{reliability.TransportWMAMQP: 5, reliability.TransportWMNATS: 12, reliability.TransportWMRedis: 12}
	for _, tr := range reliability.WatermillTransports {
		if got := reliability.ForWatermill(reliability.PoisonShortProfile(), tr).Poison.P99Ratio; got != want[tr] {
			t.Errorf("%s poison-short: p99 bound %v, want %v", tr, got, want[tr])
		}
		wantAllowance := time.Duration(0)
		if want[tr] == 12 {
			wantAllowance = 1500 * time.Millisecond
		}
		if got := reliability.ForWatermill(reliability.PoisonShortProfile(), tr).Poison.P99Allowance; got != wantAllowance {
			t.Errorf("%s poison-short: p99 allowance %v, want %v", tr, got, wantAllowance)
		}
		if got := reliability.ForWatermill(reliability.PoisonProfile(), tr).Poison.P99Ratio; got != 2 {
			t.Errorf("%s poison (long): p99 bound %v, want 2", tr, got)
		}
	}
}
