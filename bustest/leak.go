package bustest

import (
	"bytes"
	"runtime/pprof"
	"strings"
	"time"
)

// leakLabel is the pprof label every goroutine of a harness's bus carries
// (inherited from the Start and Stop calls): it tells them apart from the
// goroutines of tests running in parallel, which goleak cannot.
const leakLabel = "bustest"

// leakedGoroutines returns the stacks of the goroutines labelled with
// harness id that are still running after wait, or "" when none are.
// Goroutines end a little after Stop returns (a closed channel seen, a
// deferred close run) and say nothing when they do, so this checks again,
// with growing pauses, as goleak does.
func leakedGoroutines(id string, wait time.Duration) string {
	deadline := time.Now().Add(wait)
	pause := 100 * time.Microsecond
	for {
		stacks := labelledGoroutines(id)
		if stacks == "" || time.Now().After(deadline) {
			return stacks
		}
		time.Sleep(pause)
		pause = min(pause*2, 50*time.Millisecond)
	}
}

func labelledGoroutines(id string) string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	want := `"` + leakLabel + `":"` + id + `"`
	var out []string
	// debug=1 output: records separated by blank lines, each with a
	// "# labels: {...}" line when the goroutines carry labels.
	for rec := range strings.SplitSeq(buf.String(), "\n\n") {
		if strings.Contains(rec, "# labels: ") && strings.Contains(rec, want) {
			out = append(out, rec)
		}
	}
	return strings.Join(out, "\n\n")
}
