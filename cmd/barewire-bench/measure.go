package main

import (
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// benchMsg is the message every pipeline carries. TS is the producer's
// clock just before its transaction commits (the wire-visible timestamp);
// the exact commit instant travels in process through tracker.commits.
type benchMsg struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
	TS     int64  `json:"ts"`
	Pad    string `json:"pad"`
}

// tracker follows every message from producer commit to consumer commit.
// Latency is measured between the two commits: the producer records the
// instant its transaction committed, the consumer the instant its own
// transaction (business row + inbox) committed. Both run in this process,
// so one monotonic clock serves both ends.
type tracker struct {
	commits sync.Map // message id -> time.Time of the producer commit

	produced atomic.Int64 // committed producer transactions
	total    atomic.Int64 // committed producer transactions over every phase (never reset)
	consumed atomic.Int64 // committed consumer transactions

	winStart, winEnd atomic.Int64 // measurement window, unix nanos (0: not set)
	inWindow         atomic.Int64 // consumer commits inside the window
	producedInWindow atomic.Int64

	mu  sync.Mutex
	lat []float64 // ms, for messages whose producer committed inside the window
	// stage holds, for pipelines that report it, producer commit → consumer
	// handler start (relay, broker, delivery and inbox lock), in ms.
	stage []float64

	notify atomic.Pointer[chan string] // idle-latency waits on this
}

func newTracker() *tracker { return &tracker{} }

// tombstone marks a message consumed before its producer reported the commit.
type tombstone struct{}

// reset clears counters and samples for a new phase.
func (t *tracker) reset() {
	t.produced.Store(0)
	t.consumed.Store(0)
	t.inWindow.Store(0)
	t.producedInWindow.Store(0)
	t.winStart.Store(0)
	t.winEnd.Store(0)
	t.mu.Lock()
	t.lat = t.lat[:0]
	t.stage = t.stage[:0]
	t.mu.Unlock()
}

func (t *tracker) setWindow(start, end time.Time) {
	t.winStart.Store(start.UnixNano())
	t.winEnd.Store(end.UnixNano())
}

func (t *tracker) inside(at time.Time) bool {
	s, e := t.winStart.Load(), t.winEnd.Load()
	n := at.UnixNano()
	return s != 0 && n >= s && n < e
}

// committed records that the producer transaction carrying id committed.
func (t *tracker) committed(id string, at time.Time) {
	if _, loaded := t.commits.LoadOrStore(id, at); loaded {
		// The consumer got there first (the producer was descheduled
		// between its commit and this call) and left a tombstone.
		t.commits.Delete(id)
	}
	t.produced.Add(1)
	t.total.Add(1)
	if t.inside(at) {
		t.producedInWindow.Add(1)
	}
}

// consumedMsg records that the consumer transaction of id committed at at.
// wireTS is the producer's pre-commit timestamp from the payload, used only
// when the in-process commit instant is not known (never in practice).
func (t *tracker) consumedMsg(id string, wireTS int64, at time.Time) {
	t.consumedMsgStaged(id, wireTS, time.Time{}, at)
}

// consumedMsgStaged is consumedMsg with the instant the consumer's handler
// started (zero: unknown).
func (t *tracker) consumedMsgStaged(id string, wireTS int64, started, at time.Time) {
	t.consumed.Add(1)
	if t.inside(at) {
		t.inWindow.Add(1)
	}
	var from time.Time
	if v, ok := t.commits.LoadAndDelete(id); ok {
		if c, isTime := v.(time.Time); isTime {
			from = c
		} else {
			from = time.Unix(0, wireTS)
		}
	} else {
		from = time.Unix(0, wireTS)
		t.commits.Store(id, tombstone{})
	}
	if t.inside(from) {
		ms := float64(at.Sub(from)) / float64(time.Millisecond)
		t.mu.Lock()
		t.lat = append(t.lat, ms)
		if !started.IsZero() {
			t.stage = append(t.stage, float64(started.Sub(from))/float64(time.Millisecond))
		}
		t.mu.Unlock()
	}
	if ch := t.notify.Load(); ch != nil {
		select {
		case *ch <- id:
		default:
		}
	}
}

func (t *tracker) stageSamples() []float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.stage)
}

func (t *tracker) samples() []float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.lat)
}

// percentiles returns the p-th percentiles (0..100) of xs (nearest rank).
func percentiles(xs []float64, ps ...float64) []float64 {
	out := make([]float64, len(ps))
	if len(xs) == 0 {
		for i := range out {
			out[i] = math.NaN()
		}
		return out
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	for i, p := range ps {
		rank := int(math.Ceil(p / 100 * float64(len(s))))
		rank = min(max(rank, 1), len(s))
		out[i] = s[rank-1]
	}
	return out
}

// rssSampler samples this process's resident set size.
type rssSampler struct {
	mu      sync.Mutex
	samples []rssSample
	stop    chan struct{}
	done    chan struct{}
}

type rssSample struct {
	at  time.Time
	rss int64 // bytes
}

func startRSSSampler(every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) sample() {
	r := currentRSS()
	s.mu.Lock()
	s.samples = append(s.samples, rssSample{time.Now(), r})
	s.mu.Unlock()
}

func (s *rssSampler) close() {
	close(s.stop)
	<-s.done
}

// window returns the first, middle, last and peak RSS (MB) between from and to.
func (s *rssSampler) window(from, to time.Time) (start, mid, end, peak float64) {
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	var in []rssSample
	for _, x := range s.samples {
		if !x.at.Before(from) && !x.at.After(to) {
			in = append(in, x)
		}
	}
	if len(in) == 0 {
		r := float64(currentRSS()) / (1 << 20)
		return r, r, r, r
	}
	mb := func(b int64) float64 { return float64(b) / (1 << 20) }
	var pk int64
	for _, x := range in {
		pk = max(pk, x.rss)
	}
	return mb(in[0].rss), mb(in[len(in)/2].rss), mb(in[len(in)-1].rss), mb(pk)
}

// currentRSS reads VmRSS from /proc/self/statm (Linux); 0 elsewhere.
func currentRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is the 1-minute load average (Linux; 0 elsewhere).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// serverCPU is the CPU time so far of the PostgreSQL processes (backends
// and auxiliary processes: WAL writer, checkpointer, …) and the RabbitMQ
// node (beam.smp) running on this machine, read from /proc (Linux; zero
// elsewhere, or when the servers run in another PID namespace). A process
// that exits between two readings takes its CPU with it; one that starts
// between them counts in full. The servers are shared: work that other
// clients make them do in the same window is counted too.
type serverCPU struct {
	pg, rabbit map[int]time.Duration
}

// readServerCPU reads the CPU time of every postgres and beam.smp process.
func readServerCPU() serverCPU {
	s := serverCPU{pg: map[int]time.Duration{}, rabbit: map[int]time.Duration{}}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return s
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, cpu, ok := procCPU(pid)
		if !ok {
			continue
		}
		switch comm {
		case "postgres":
			s.pg[pid] = cpu
		case "beam.smp":
			s.rabbit[pid] = cpu
		}
	}
	return s
}

// since returns the CPU the servers spent between earlier and s.
func (s serverCPU) since(earlier serverCPU) (pg, rabbit time.Duration) {
	delta := func(now, then map[int]time.Duration) time.Duration {
		var d time.Duration
		for pid, c := range now {
			d += c - then[pid] // a new process: all of it
		}
		return max(d, 0)
	}
	return delta(s.pg, earlier.pg), delta(s.rabbit, earlier.rabbit)
}

// procCPU reads a process's command name and user+system CPU time from
// /proc/<pid>/stat.
func procCPU(pid int) (comm string, cpu time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	return parseProcStat(string(b))
}

// parseProcStat parses a /proc/<pid>/stat line of a postgres or beam.smp
// process: "pid (comm) state ppid … utime(14) stime(15) …", where comm may
// hold spaces and parentheses.
func parseProcStat(st string) (comm string, cpu time.Duration, ok bool) {
	open, closing := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
	if open < 0 || closing < open {
		return "", 0, false
	}
	comm = st[open+1 : closing]
	if comm != "postgres" && comm != "beam.smp" {
		return comm, 0, false
	}
	f := strings.Fields(st[closing+1:])
	// f[0] is field 3 (state): utime is field 14, stime 15.
	if len(f) < 13 {
		return "", 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	stt, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, false
	}
	return comm, time.Duration(ut+stt) * time.Second / clockTicks, true
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100
