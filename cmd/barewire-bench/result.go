package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
)

// Result is one row of the report (one JSON object with -json).
type Result struct {
	Scenario string `json:"scenario"`
	Variant  string `json:"variant,omitempty"`

	MsgsPerS         float64 `json:"msgs_per_s"`
	BaselineMsgsPerS float64 `json:"baseline_msgs_per_s"`
	Ratio            float64 `json:"ratio"`
	// RatioOf names the yardstick of Ratio (the hand-written baseline's
	// closed-loop peak unless said otherwise).
	RatioOf string `json:"ratio_of,omitempty"`

	P50     float64 `json:"p50_ms"`
	P95     float64 `json:"p95_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	Samples int     `json:"latency_samples"`

	PeakRSSMB  float64 `json:"peak_rss_mb"`
	RSSStartMB float64 `json:"rss_start_mb"`
	RSSMidMB   float64 `json:"rss_mid_mb"`
	RSSEndMB   float64 `json:"rss_end_mb"`
	// CPUPerMsgUS is this process's CPU (user+system, load generator and
	// consumers included) per consumed message, in microseconds.
	CPUPerMsgUS float64 `json:"cpu_us_per_msg"`
	// PGCPUPerMsgUS and RabbitCPUPerMsgUS are the CPU of the PostgreSQL
	// processes and of the RabbitMQ node (beam.smp) on this machine per
	// consumed message, read from /proc over the same window (shared
	// servers: other clients' work in that window counts too);
	// SystemCPUPerMsgUS is the three together: what a message costs the
	// machine.
	PGCPUPerMsgUS     float64 `json:"pg_cpu_us_per_msg"`
	RabbitCPUPerMsgUS float64 `json:"rabbitmq_cpu_us_per_msg"`
	SystemCPUPerMsgUS float64 `json:"system_cpu_us_per_msg"`

	OfferedRate  float64 `json:"offered_rate,omitempty"` // 0: closed loop
	ProducedPerS float64 `json:"produced_per_s"`
	Produced     int64   `json:"produced"`
	Consumed     int64   `json:"consumed"`
	Duplicates   int64   `json:"duplicate_effects"`
	Missing      int64   `json:"missing_effects"`

	DurationS float64 `json:"duration_s"`
	Producers int     `json:"producers"`
	Consumers int     `json:"consumers"`
	Payload   int     `json:"payload_bytes"`

	// LoadAvg1m is the machine's 1-minute load average when the result was
	// taken: other work on a shared machine shows up here.
	LoadAvg1m float64 `json:"loadavg_1m"`

	Notes []string       `json:"notes,omitempty"`
	Extra map[string]any `json:"extra,omitempty"`
}

func (r *Result) setRatio(base float64, of string) {
	r.BaselineMsgsPerS = base
	r.RatioOf = of
	if base > 0 {
		r.Ratio = r.MsgsPerS / base
	}
}

// clean replaces NaN and Inf (no samples) by 0 so that the JSON is valid.
func (r *Result) clean() {
	for _, p := range []*float64{&r.P50, &r.P95, &r.P99, &r.Max, &r.Ratio, &r.MsgsPerS} {
		if math.IsNaN(*p) || math.IsInf(*p, 0) {
			*p = 0
		}
	}
}

func (r Result) key() string {
	if r.Variant == "" {
		return r.Scenario
	}
	return r.Scenario + "/" + r.Variant
}

func writeJSON(w io.Writer, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintf(w, `{"error":%q}`+"\n", err.Error())
		return
	}
	fmt.Fprintf(w, "%s\n", b)
}

func fmtMS(v float64, n int) string {
	if n == 0 || math.IsNaN(v) {
		return "-"
	}
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtRate(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

// writeTable prints the results as an aligned table.
func writeTable(w io.Writer, rs []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tvariant\tmsg/s\tbaseline msg/s\tratio\toffered/s\tp50 ms\tp95 ms\tp99 ms\tmax ms\tn\tCPU µs/msg\tPG/RMQ/tool+PG+RMQ µs/msg\tRSS start/mid/end/peak MB\teffects check\tload\t")
	for _, r := range rs {
		ratio := "-"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		check := "ok"
		if r.Duplicates != 0 || r.Missing != 0 {
			check = fmt.Sprintf("dup %d, missing %d", r.Duplicates, r.Missing)
		}
		if r.Produced == 0 && r.Consumed == 0 {
			check = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%.0f\t%.0f/%.0f/%.0f\t%.0f/%.0f/%.0f/%.0f\t%s\t%.1f\t\n",
			r.Scenario, r.Variant, fmtRate(r.MsgsPerS), fmtRate(r.BaselineMsgsPerS), ratio, fmtRate(r.OfferedRate),
			fmtMS(r.P50, r.Samples), fmtMS(r.P95, r.Samples), fmtMS(r.P99, r.Samples), fmtMS(r.Max, r.Samples), r.Samples,
			r.CPUPerMsgUS, r.PGCPUPerMsgUS, r.RabbitCPUPerMsgUS, r.SystemCPUPerMsgUS, r.RSSStartMB, r.RSSMidMB, r.RSSEndMB, r.PeakRSSMB, check, r.LoadAvg1m)
	}
	_ = tw.Flush()
	for _, r := range rs {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "note [%s]: %s\n", r.key(), n)
		}
	}
}

// target is one of the goals, checked against this run's numbers.
type target struct {
	Scenario string  `json:"scenario"` // always "target"
	Name     string  `json:"name"`
	Goal     string  `json:"goal"`
	Measured string  `json:"measured"`
	Value    float64 `json:"value"`
	Pass     bool    `json:"pass"`
}

func writeTargets(w io.Writer, ts []target) {
	if len(ts) == 0 {
		return
	}
	fmt.Fprintln(w, "\nTargets (same run):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range ts {
		verdict := "FAIL"
		if t.Pass {
			verdict = "pass"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", verdict, t.Name, t.Goal, t.Measured)
	}
	_ = tw.Flush()
}
