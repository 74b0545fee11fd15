//go:build linux

package reliability

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/barewire-go/barewire/reliability/workload"
)

// Node faults, injected on a cluster run (Env.Cluster) only.
const (
	// FaultNodeKill SIGKILLs the RabbitMQ node that leads one of the run's
	// quorum queues (a crash), keeps it down for Profile.NodeHold and
	// starts it again.
	FaultNodeKill FaultKind = "node-kill"
	// FaultNodeStop stops gracefully (rabbitmqctl stop) the node the first
	// consumer process is connected to (read from its log), keeps it down
	// for Profile.NodeHold and starts it again.
	FaultNodeStop FaultKind = "node-stop"
)

// Targets after the loss of the node a process is connected to (issue #20):
// consuming again within TargetAgainP50 at the median and TargetAgainMax at
// worst.
const (
	TargetAgainP50 = 5 * time.Second
	TargetAgainMax = 15 * time.Second
)

// ForCluster adapts p to a RabbitMQ cluster (Env.Cluster): quorum queues,
// and node faults instead of the faults that need a single broker
// (broker-close and stop-cont cut a consumer's connections at its own
// proxy, which a process failing over between nodes does not have) or that
// would only slow the run down (pg-restart: the RabbitMQ profile has it).
// The short profile (CI) kills the leader of one queue and stops the node
// a consumer is connected to, with a consumer and a relay killed in between, from
// the start of about 2 minutes of load (a node's restart takes 15-40 s on
// a loaded 2-core machine, minutes at a load average of 40); the long one injects a random fault every FaultGap, node faults
// half of the time, for as long as the producer runs.
func ForCluster(p Profile) Profile {
	p.Transport = TransportRabbitMQ
	p.QueueType = "quorum"
	p.Name += "-cluster"
	switch p.Name {
	case "long-cluster":
		p.NodeHold = 20 * time.Second
		p.Script = []FaultKind{FaultNodeKill, FaultConsumerKill, FaultNodeStop, FaultRelayKill, FaultProducerKill}
		p.SpreadScript = false
		p.Random = []FaultKind{FaultNodeKill, FaultNodeStop, FaultNodeKill, FaultConsumerKill, FaultRelayKill, FaultProducerKill}
		p.FaultGap = 20 * time.Second
	default:
		p.NodeHold = 8 * time.Second
		p.Messages = envInt("BAREWIRE_RELIABILITY_MESSAGES", 5000)
		p.Rate = envFloat("BAREWIRE_RELIABILITY_RATE", 50)
		p.Script = []FaultKind{FaultNodeKill, FaultConsumerKill, FaultNodeStop, FaultRelayKill}
		p.SpreadScript = false
		p.FaultGap = 5 * time.Second
		p.Random = nil
	}
	return p
}

// Cluster drives a RabbitMQ cluster through scripts/rabbitmq-cluster.sh
// (nodes numbered from 1, URLs in node order) and reads its queues from
// whichever node runs.
type Cluster struct {
	// Script is the path of scripts/rabbitmq-cluster.sh.
	Script string
	// URLs are the nodes' AMQP URLs, in node order.
	URLs []string

	mu     sync.Mutex
	events []nodeEvent
}

var _ queueOps = (*Cluster)(nil)

// nodeEvent is one node fault.
type nodeEvent struct {
	kind  FaultKind
	node  int
	queue string // the queue whose leader it was
	at    time.Time
	up    time.Time // start-node returned: the node answers again
}

// Run runs the script with args.
func (c *Cluster) Run(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, c.Script, args...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("%s %s: %w: %s", filepath.Base(c.Script), strings.Join(args, " "), err, lastLine(s))
	}
	return s, nil
}

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Answers reports whether node n accepts TCP connections on its AMQP port.
func (c *Cluster) Answers(n int) bool {
	u, err := url.Parse(c.URLs[n-1])
	if err != nil {
		return false
	}
	conn, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// running returns the first node that answers, or 0.
func (c *Cluster) running() int {
	for n := 1; n <= len(c.URLs); n++ {
		if c.Answers(n) {
			return n
		}
	}
	return 0
}

// QueueDepths counts each queue's messages, unacknowledged ones included,
// on a running node.
func (c *Cluster) QueueDepths(ctx context.Context, queues []string) (map[string]int, error) {
	n := c.running()
	if n == 0 {
		return nil, errors.New("reliability: no cluster node answers")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := c.Run(ctx, "ctl", strconv.Itoa(n), "list_queues", "-q", "--no-table-headers", "name", "messages")
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, q := range queues {
		want[q] = true
	}
	depths := map[string]int{}
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && want[f[0]] {
			d, _ := strconv.Atoi(f[1])
			depths[f[0]] = d
		}
	}
	return depths, nil
}

// DeleteTopology deletes the run's queues and exchanges through a running
// node.
func (c *Cluster) DeleteTopology(queues, exchanges []string) error {
	n := c.running()
	if n == 0 {
		return errors.New("reliability: no cluster node answers")
	}
	return (&Broker{URL: c.URLs[n-1]}).DeleteTopology(queues, exchanges)
}

// nodeFault kills the node that leads one of the run's queues (the n-th,
// in turn), or stops the node the first consumer is connected to, keeps
// it down for NodeHold and starts it again. The load goes on meanwhile;
// clusterReport measures what the processes did.
func (r *run) nodeFault(ctx context.Context, kind FaultKind, n int) (string, error) {
	c := r.env.Cluster
	if c == nil {
		return "not a cluster run", errSkipped
	}
	var node int
	var queue string
	if kind == FaultNodeStop {
		r.mu.Lock()
		first := r.consumers[0].Name()
		r.mu.Unlock()
		var err error
		if node, err = c.nodeOf(r.env.LogDir, first); err != nil {
			return "", err
		}
		queue = "connection of " + first
	} else {
		queues := r.names.Queues()
		queue = queues[n%len(queues)]
		out, err := c.Run(ctx, "leader", queue)
		if err != nil {
			return "", fmt.Errorf("find the leader of %s: %w", queue, err)
		}
		node, err = strconv.Atoi(lastLine(out))
		if err != nil || node < 1 || node > len(c.URLs) {
			return "", fmt.Errorf("leader of %s: unexpected answer %q", queue, out)
		}
		queue = "leader of " + queue
	}
	cmd := "kill-node"
	if kind == FaultNodeStop {
		cmd = "stop-node"
	}
	ev := nodeEvent{kind: kind, node: node, queue: queue, at: time.Now()}
	if _, err := c.Run(ctx, cmd, strconv.Itoa(node)); err != nil {
		return "", err
	}
	downIn := time.Since(ev.at)
	sleepCtx(ctx, r.prof.NodeHold)
	// The node must come back even when the run is being cancelled: a
	// cluster left with a node down makes the next run's start wait.
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	started := time.Now()
	if _, err := c.Run(startCtx, "start-node", strconv.Itoa(node)); err != nil {
		return "", err
	}
	ev.up = time.Now()
	c.mu.Lock()
	c.events = append(c.events, ev)
	c.mu.Unlock()
	return fmt.Sprintf("node %d (%s): %s in %s, down %s, start-node took %s",
		node, queue, cmd, downIn.Round(time.Millisecond), ev.up.Sub(ev.at).Round(100*time.Millisecond), ev.up.Sub(started).Round(100*time.Millisecond)), nil
}

// ClusterReport is what the processes did around each node fault.
type ClusterReport struct {
	Faults []NodeFaultReport
	// Reconnects and Again pool every process's reconnect and consuming-
	// again times over the faults.
	Reconnects, Again []time.Duration
}

// NodeFaultReport is one node fault.
type NodeFaultReport struct {
	Kind  FaultKind
	Node  int
	Queue string
	// Down is from the kill or stop to the node answering again.
	Down time.Duration
	// Reconnect is, per process that lost its connection, the time from
	// the loss (its transport's "connection lost" log line: for a SIGKILL
	// on this host the same millisecond, the kernel resets the sockets;
	// for a graceful stop, when the node closes its client connections,
	// seconds into rabbitmqctl stop) to its new connection with the
	// topology declared; Again, per consumer process, from the loss to its
	// first effect committed after the reconnect.
	Reconnect, Again map[string]time.Duration
	// Missing names processes that lost their connection and had not
	// reconnected (or consumed) by the time the node was back.
	Missing []string
	// Before, During and After are effects (and follow-ups) per second in
	// the Window before the fault, while the node was down, and in the
	// Window after it answered again.
	Before, During, After float64
	Window                time.Duration
}

// throughputWindow is the width of the before and after windows.
const throughputWindow = 10 * time.Second

// clusterReport reads the processes' logs for their connection losses and
// reconnects, and the effect tables for consumption, around each node
// fault.
func (r *run) clusterReport(ctx context.Context) (*ClusterReport, error) {
	c := r.env.Cluster
	c.mu.Lock()
	events := slices.Clone(c.events)
	c.mu.Unlock()
	logs := map[string][]logEvent{}
	for _, p := range r.all() {
		ev, err := readConnEvents(r.env.LogDir, p.Name())
		if err != nil {
			return nil, err
		}
		logs[p.Name()] = ev
	}
	consumers := map[string]bool{}
	for _, p := range r.consumers {
		consumers[p.Name()] = true
	}
	rep := &ClusterReport{}
	for _, ev := range events {
		f := NodeFaultReport{Kind: ev.kind, Node: ev.node, Queue: ev.queue, Down: ev.up.Sub(ev.at),
			Reconnect: map[string]time.Duration{}, Again: map[string]time.Duration{}, Window: throughputWindow}
		for _, name := range slices.Sorted(mapKeys(logs)) {
			lost, back, ok := reconnectAfter(logs[name], ev.at, ev.up)
			if !lost.IsZero() && !ok {
				f.Missing = append(f.Missing, name+" (not reconnected)")
			}
			if !ok {
				continue
			}
			d := back.Sub(lost)
			f.Reconnect[name] = d
			rep.Reconnects = append(rep.Reconnects, d)
			if !consumers[name] {
				continue
			}
			first, err := r.firstEffectAfter(ctx, name, back)
			if err != nil {
				return nil, err
			}
			if first.IsZero() {
				// Nothing after the reconnect: a failure only if others
				// still consumed (otherwise the load was over).
				if rate, err := r.effectRate(ctx, back, time.Now()); err != nil {
					return nil, err
				} else if rate > 0 {
					f.Missing = append(f.Missing, name+" (not consuming again while others did)")
				}
				continue
			}
			a := first.Sub(lost)
			f.Again[name] = a
			rep.Again = append(rep.Again, a)
		}
		var err error
		if f.Before, err = r.effectRate(ctx, ev.at.Add(-throughputWindow), ev.at); err != nil {
			return nil, err
		}
		if f.During, err = r.effectRate(ctx, ev.at, ev.up); err != nil {
			return nil, err
		}
		if f.After, err = r.effectRate(ctx, ev.up, ev.up.Add(throughputWindow)); err != nil {
			return nil, err
		}
		rep.Faults = append(rep.Faults, f)
	}
	return rep, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// reconnectAfter finds the first connection loss in [from-1s, until] and
// the reconnect that followed it.
func reconnectAfter(evs []logEvent, from, until time.Time) (lost, back time.Time, ok bool) {
	for _, e := range evs {
		if lost.IsZero() {
			if e.msg == logConnLost && !e.at.Before(from.Add(-time.Second)) && !e.at.After(until) {
				lost = e.at
			}
			continue
		}
		if e.msg == logReconnected {
			return lost, e.at, true
		}
	}
	return lost, time.Time{}, false
}

// firstEffectAfter returns when consumer process name first committed an
// effect or follow-up after t (zero if never).
func (r *run) firstEffectAfter(ctx context.Context, name string, t time.Time) (time.Time, error) {
	var first sql.NullTime
	q := `SELECT min(at) FROM (SELECT min(created_at) AS at FROM ` + r.names.Table(workload.TableEffects) + ` WHERE instance = ? AND created_at > ?
		UNION ALL SELECT min(created_at) FROM ` + r.names.Table(workload.TableFollowups) + ` WHERE instance = ? AND created_at > ?) x`
	if err := r.db.WithContext(ctx).Raw(q, name, t, name, t).Scan(&first).Error; err != nil {
		return time.Time{}, err
	}
	return first.Time, nil // zero when NULL
}

// effectRate is the effects and follow-ups committed per second in [from, to).
func (r *run) effectRate(ctx context.Context, from, to time.Time) (float64, error) {
	if !to.After(from) {
		return 0, nil
	}
	var n int64
	q := `SELECT (SELECT count(*) FROM ` + r.names.Table(workload.TableEffects) + ` WHERE created_at >= ? AND created_at < ?)
		+ (SELECT count(*) FROM ` + r.names.Table(workload.TableFollowups) + ` WHERE created_at >= ? AND created_at < ?)`
	if err := r.db.WithContext(ctx).Raw(q, from, to, from, to).Scan(&n).Error; err != nil {
		return 0, err
	}
	return float64(n) / to.Sub(from).Seconds(), nil
}

// The transport's log messages the report reads (transport/rabbitmq).
const (
	logConnLost    = "rabbitmq connection lost, reconnecting"
	logReconnected = "rabbitmq reconnected"
	logConnected   = "rabbitmq connected"
)

// nodeOf returns the node process name is connected to: the one in the
// URL of the last "connected" or "reconnected" line of its logs.
func (c *Cluster) nodeOf(logDir, name string) (int, error) {
	files, err := filepath.Glob(filepath.Join(logDir, name+".*.log"))
	if err != nil {
		return 0, err
	}
	var last struct {
		at  time.Time
		url string
	}
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if !strings.Contains(line, `"rabbitmq `) {
				continue
			}
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
				URL  string    `json:"url"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && (rec.Msg == logConnected || rec.Msg == logReconnected) && !rec.Time.Before(last.at) {
				last.at, last.url = rec.Time, rec.URL
			}
		}
	}
	lu, err := url.Parse(last.url)
	if last.url == "" || err != nil {
		return 0, fmt.Errorf("%s: no connection to a node in its logs", name)
	}
	for i, raw := range c.URLs {
		if u, err := url.Parse(raw); err == nil && u.Host == lu.Host {
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("%s is connected to %s, not to a cluster node", name, last.url)
}

type logEvent struct {
	at  time.Time
	msg string
}

// readConnEvents reads the connection losses and reconnects from every
// incarnation's log of process name, in time order.
func readConnEvents(dir, name string) ([]logEvent, error) {
	files, err := filepath.Glob(filepath.Join(dir, name+".*.log"))
	if err != nil {
		return nil, err
	}
	var out []logEvent
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 8<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if !strings.Contains(string(line), `"rabbitmq `) {
				continue
			}
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal(line, &rec) != nil || (rec.Msg != logConnLost && rec.Msg != logReconnected) {
				continue
			}
			out = append(out, logEvent{at: rec.Time, msg: rec.Msg})
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(out, func(a, b logEvent) int { return a.at.Compare(b.at) })
	return out, nil
}

// quantiles returns the median and the maximum of ds.
func quantiles(ds []time.Duration) (p50, maxD time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2], s[len(s)-1]
}

// Lines are the report's summary lines.
func (c *ClusterReport) Lines() []string {
	var out []string
	for _, f := range c.Faults {
		out = append(out, fmt.Sprintf("%s node %d (%s), down %.1fs: reconnect %s; consuming again %s; effects/s before %.0f, during %.0f, after %.0f (%s windows)",
			f.Kind, f.Node, f.Queue, f.Down.Seconds(), fmtDurations(f.Reconnect), fmtDurations(f.Again), f.Before, f.During, f.After, f.Window))
		for _, m := range f.Missing {
			out = append(out, "  "+m)
		}
	}
	rp50, rmax := quantiles(c.Reconnects)
	ap50, amax := quantiles(c.Again)
	out = append(out, fmt.Sprintf("cluster: after a node loss, reconnect p50 %.2fs max %.2fs (%d process reconnects); consuming again p50 %.2fs max %.2fs (%d; targets %v / %v)",
		rp50.Seconds(), rmax.Seconds(), len(c.Reconnects), ap50.Seconds(), amax.Seconds(), len(c.Again), TargetAgainP50, TargetAgainMax))
	return out
}

func fmtDurations(m map[string]time.Duration) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(mapKeys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.2fs", k, m[k].Seconds()))
	}
	return strings.Join(parts, ", ")
}

// Failures are the cluster targets the run missed.
func (c *ClusterReport) Failures() []string {
	var out []string
	if len(c.Faults) == 0 {
		return append(out, "cluster: no node fault was injected")
	}
	if len(c.Reconnects) == 0 {
		out = append(out, "cluster: no process lost its connection to a node fault: the faults tested nothing")
	}
	for _, f := range c.Faults {
		for _, m := range f.Missing {
			out = append(out, fmt.Sprintf("cluster: %s node %d: %s", f.Kind, f.Node, m))
		}
	}
	p50, maxD := quantiles(c.Again)
	if p50 > TargetAgainP50 || maxD > TargetAgainMax {
		out = append(out, fmt.Sprintf("cluster: consuming again after a node loss p50 %.2fs max %.2fs; targets %v and %v", p50.Seconds(), maxD.Seconds(), TargetAgainP50, TargetAgainMax))
	}
	return out
}
