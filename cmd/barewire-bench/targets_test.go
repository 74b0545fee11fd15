package main

import "testing"

// TestTargetsOfIssue16: the targets the tool checks from one run's results,
// with the numbers of the run at 1b6d8eb (docs/benchmarks.md): e2e against
// the baseline and against each tuned forwarder, CPU per message against
// the baseline's, and the PostgreSQL transport against e2e.
func TestTargetsOfIssue16(t *testing.T) {
	r := &runner{results: []Result{
		{Scenario: "baseline", Variant: "peak", MsgsPerS: 1331, CPUPerMsgUS: 293, SystemCPUPerMsgUS: 1267},
		{Scenario: "e2e", Variant: "peak", MsgsPerS: 722, BaselineMsgsPerS: 1331, Ratio: 0.53, CPUPerMsgUS: 663, SystemCPUPerMsgUS: 2566},
		{Scenario: "watermill-forwarder", Variant: "tuned", MsgsPerS: 1186},
		{Scenario: "watermill-forwarder", Variant: "tuned+confirms", MsgsPerS: 564},
		{Scenario: "pg-transport", Variant: "peak", MsgsPerS: 539, Extra: map[string]any{"ratio_to_e2e": 0.72}},
	}}
	want := map[string]struct {
		value float64
		pass  bool
	}{
		"e2e throughput vs baseline":                    {0.53, false},
		"e2e throughput vs forwarder tuned":             {722.0 / 1186, false},
		"e2e throughput vs forwarder tuned+confirms":    {722.0 / 564, false},
		"e2e client CPU per message vs baseline":        {663.0 / 293, false},
		"e2e whole-machine CPU per message vs baseline": {2566.0 / 1267, false},
		"PostgreSQL transport vs RabbitMQ e2e":          {0.72, false},
	}
	got := map[string]target{}
	for _, tg := range r.targets() {
		got[tg.Name] = tg
	}
	for name, w := range want {
		tg, ok := got[name]
		if !ok {
			t.Errorf("target %q not checked; got %v", name, got)
			continue
		}
		if d := tg.Value - w.value; d > 1e-9 || d < -1e-9 || tg.Pass != w.pass {
			t.Errorf("%s = %.4f pass %v, want %.4f pass %v", name, tg.Value, tg.Pass, w.value, w.pass)
		}
	}
	// A forwarder 2.5x slower with confirms passes that target.
	r.results[3].MsgsPerS = 280
	for _, tg := range r.targets() {
		if tg.Name == "e2e throughput vs forwarder tuned+confirms" && !tg.Pass {
			t.Errorf("%s = %.2f: want a pass at >= 2.5", tg.Name, tg.Value)
		}
	}
}
