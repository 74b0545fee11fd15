package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
)

// TestProbeQuorumLeaderLoss measures what RabbitMQ does with confirmed
// publishes to quorum queues whose leader node is SIGKILLed (issue #20's
// loss; results in docs/guarantees.md, known defects). Each round declares
// BAREWIRE_CLUSTER_PROBE_QUEUES (8) quorum queues led by node X, each behind
// its own fanout exchange, consumes them from the third node Z and from X,
// publishes to them from node Y with publisher confirms — half of the
// exchanges from a channel whose publishes are mandatory (with a return
// listener), half from one whose are not — kills X, keeps publishing for
// 6 s, then compares what the broker acked with what the consumers got and
// what is left in the queues. It kills cluster nodes, so it runs only when
// BAREWIRE_CLUSTER_PROBE_ROUNDS is set (a number of rounds). Variants:
//
//   - BAREWIRE_CLUSTER_PROBE_STOP_MS=N stops Z's VM for N ms right after
//     the kill, so that the first election fails (as on a loaded machine);
//   - BAREWIRE_CLUSTER_PROBE_LATE=1 opens the publishing channels only
//     after the kill (a new publisher, or a channel replaced after a nack);
//   - BAREWIRE_CLUSTER_PROBE_MODE=transport publishes through the
//     transport's Deliver in batches of 20, like the outbox relay (with
//     BAREWIRE_CLUSTER_PROBE_MANDATORY=1, Config.Mandatory), and with
//     BAREWIRE_CLUSTER_PROBE_FAILOVER=1 connected to X first, so that it
//     fails over to Y in the window;
//   - BAREWIRE_CLUSTER_PROBE_INFLIGHT caps unconfirmed raw publishes per
//     channel (100), BAREWIRE_CLUSTER_PROBE_EVERY_US paces them (2000 µs).
func TestProbeQuorumLeaderLoss(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("BAREWIRE_CLUSTER_PROBE_ROUNDS"))
	if rounds <= 0 {
		t.Skip("kills cluster nodes: set BAREWIRE_CLUSTER_PROBE_ROUNDS (and BAREWIRE_TEST_AMQP_CLUSTER_URLS)")
	}
	nq := envInt("BAREWIRE_CLUSTER_PROBE_QUEUES", 8)
	inflight := envInt("BAREWIRE_CLUSTER_PROBE_INFLIGHT", 100)
	urls := testenv.AMQPClusterURLs(t)
	if len(urls) < 3 {
		t.Fatalf("needs 3 nodes, got %d", len(urls))
	}
	pc := &probeCluster{t: t, script: testenv.ClusterScript(t), urls: urls}
	var total probeResult
	for r := 0; r < rounds; r++ {
		x := r%3 + 1
		y := x%3 + 1
		res := pc.round(r, x, y, nq, inflight)
		t.Logf("round %d (leader node %d killed, publisher on node %d): %s", r, x, y, &res)
		total.add(res)
	}
	t.Logf("TOTAL over %d rounds × %d queues: %s", rounds, nq, &total)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type probeCluster struct {
	t      *testing.T
	script string
	urls   []string
}

func (c *probeCluster) run(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.script, args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", c.script, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func (c *probeCluster) answers(n int) bool {
	conn, err := amqp.DialConfig(c.urls[n-1], amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// probeMsg is one publish and what the broker said about it.
type probeMsg struct {
	id        string
	queue     int
	mandatory bool
	sent      time.Time
	confirmed time.Time
	acked     bool
	nacked    bool
	returned  string // reply code and text of a basic.return
	inQueue   int
	// afterNack: its channel had nacked a publish before this confirm.
	afterNack bool
	// deferred counts the confirms the transport did not trust (the
	// suspect window): each was an ack, and the message was sent again.
	deferred int
	// verdict receives the publish's DeferredConfirmation (nil if the
	// publish failed) once the publish call returned: the probe reads
	// ack or nack there, not on NotifyPublish, which reports a nack that
	// arrived out of order as part of a later multiple ack (issue 31).
	verdict chan *amqp.DeferredConfirmation
	// merged: NotifyPublish reported an ack while the publish's own
	// confirm was a nack (amqp091's multiple ack over an earlier nack).
	merged bool
}

type probeResult struct {
	published, acked, nacked, unconfirmed, returned int
	lost, lostReturned, lostMandatory               int // acked, not in the queue
	lostAfterNack, ackedAfterNack                   int
	// deferred: messages the transport sent again after an untrusted
	// ack; caught: of them, those with fewer copies in the queue than
	// acked sends, so that an untrusted ack was a lie the window caught.
	deferred, caught int
	// merged: nacks NotifyPublish reported as acks (probeMsg.merged);
	// mergedNotInQueue: of them, those no queue held (a reader of
	// NotifyPublish counts them as acked and lost).
	merged, mergedNotInQueue int
	extra, doubled           int // in a queue unacked / twice
	lostQueues               int
	lostAfterKill            []time.Duration
	notes                    []string
}

func (r *probeResult) add(o probeResult) {
	r.published += o.published
	r.acked += o.acked
	r.nacked += o.nacked
	r.unconfirmed += o.unconfirmed
	r.returned += o.returned
	r.lost += o.lost
	r.lostReturned += o.lostReturned
	r.lostMandatory += o.lostMandatory
	r.lostAfterNack += o.lostAfterNack
	r.deferred += o.deferred
	r.caught += o.caught
	r.merged += o.merged
	r.mergedNotInQueue += o.mergedNotInQueue
	r.ackedAfterNack += o.ackedAfterNack
	r.extra += o.extra
	r.doubled += o.doubled
	r.lostQueues += o.lostQueues
	r.lostAfterKill = append(r.lostAfterKill, o.lostAfterKill...)
}

func (r *probeResult) String() string {
	s := fmt.Sprintf("published %d, acked %d, nacked %d, unconfirmed %d, returned %d; LOST (acked, not in queue) %d in %d queues (of them mandatory %d, returned %d, acked after a nack on their channel %d of %d such acks); in queue but not acked %d, twice %d",
		r.published, r.acked, r.nacked, r.unconfirmed, r.returned, r.lost, r.lostQueues, r.lostMandatory, r.lostReturned, r.lostAfterNack, r.ackedAfterNack, r.extra, r.doubled)
	s += fmt.Sprintf("; nacks NotifyPublish reported as acks %d (%d of them in no queue)", r.merged, r.mergedNotInQueue)
	if r.deferred > 0 {
		s += fmt.Sprintf("; suspect window: %d messages sent again after an untrusted ack, %d of them with an ack the queue never held (caught)", r.deferred, r.caught)
	}
	if len(r.lostAfterKill) > 0 {
		sort.Slice(r.lostAfterKill, func(i, j int) bool { return r.lostAfterKill[i] < r.lostAfterKill[j] })
		s += fmt.Sprintf("; lost ones confirmed %v..%v after the kill", r.lostAfterKill[0].Round(time.Millisecond), r.lostAfterKill[len(r.lostAfterKill)-1].Round(time.Millisecond))
	}
	if len(r.notes) > 0 {
		s += "; " + strings.Join(r.notes, "; ")
	}
	return s
}

func (c *probeCluster) round(r, x, y, nq, inflight int) probeResult {
	t := c.t
	for n := 1; n <= len(c.urls); n++ {
		if !c.answers(n) {
			c.run("start-node", strconv.Itoa(n))
		}
	}
	sfx := fmt.Sprintf("%d-%s", r, uniq("probe"))
	names := make([]string, nq)
	// Declared on node x, so that x leads them (client-local).
	cx, err := amqp.Dial(c.urls[x-1])
	if err != nil {
		t.Fatal(err)
	}
	chx, err := cx.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for i := range names {
		names[i] = fmt.Sprintf("%s.q%d", sfx, i)
		if _, err := chx.QueueDeclare(names[i], true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		if err := chx.ExchangeDeclare(names[i], "fanout", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := chx.QueueBind(names[i], "", names[i], false, nil); err != nil {
			t.Fatal(err)
		}
	}
	_ = cx.Close()
	leaders := c.run("ctl", strconv.Itoa(y), "-q", "list_queues", "name", "leader", "--no-table-headers")
	onX := 0
	for _, line := range strings.Split(leaders, "\n") {
		if strings.HasPrefix(line, sfx) && strings.Contains(line, fmt.Sprintf("%s%d@", probePrefix(), x)) {
			onX++
		}
	}
	if onX != nq {
		t.Logf("only %d of %d queues are led by node %d:\n%s", onX, nq, x, leaders)
	}

	cy, err := amqp.Dial(c.urls[y-1])
	if err != nil {
		t.Fatal(err)
	}
	defer cy.Close()

	var mu sync.Mutex
	var all []*probeMsg
	byID := map[string]*probeMsg{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	started := make(chan struct{}, 2)
	pubLoop := func(mandatory bool, queues []int) {
		defer wg.Done()
		ch, err := cy.Channel()
		if err != nil {
			t.Error(err)
			return
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			t.Error(err)
			return
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100000))
		returns := ch.NotifyReturn(make(chan amqp.Return, 100000))
		sem := make(chan struct{}, inflight)
		tags := map[uint64]*probeMsg{}
		var tmu sync.Mutex
		doneConf := make(chan struct{})
		sawNack := false
		go func() {
			defer close(doneConf)
			for {
				select {
				case cf, ok := <-confirms:
					if !ok {
						return
					}
					tmu.Lock()
					m := tags[cf.DeliveryTag]
					delete(tags, cf.DeliveryTag)
					tmu.Unlock()
					ack := cf.Ack
					if m != nil {
						if dc := <-m.verdict; dc != nil {
							ack = dc.Acked()
						}
						m.merged = cf.Ack && !ack
						mu.Lock()
						m.confirmed = time.Now()
						m.acked, m.nacked = ack, !ack
						m.afterNack = sawNack
						mu.Unlock()
						<-sem
					}
					if !ack {
						sawNack = true
					}
				case rt, ok := <-returns:
					if !ok {
						returns = nil
						continue
					}
					mu.Lock()
					if m := byID[rt.MessageId]; m != nil {
						m.returned = fmt.Sprintf("%d %s", rt.ReplyCode, rt.ReplyText)
					}
					mu.Unlock()
				}
			}
		}()
		seq := uint64(0)
		first := true
		// A relay's pace rather than the broker's maximum: one publish per
		// BAREWIRE_CLUSTER_PROBE_EVERY_US microseconds per channel.
		tick := time.NewTicker(time.Duration(envInt("BAREWIRE_CLUSTER_PROBE_EVERY_US", 2000)) * time.Microsecond)
		defer tick.Stop()
	loop:
		for k := 0; ; k++ {
			select {
			case <-stop:
				break loop
			case <-tick.C:
			}
			select {
			case <-stop:
				break loop
			case sem <- struct{}{}:
			}
			q := queues[k%len(queues)]
			m := &probeMsg{id: fmt.Sprintf("%s-%d-%d", sfx, q, k), queue: q, mandatory: mandatory, sent: time.Now(),
				verdict: make(chan *amqp.DeferredConfirmation, 1)}
			mu.Lock()
			all = append(all, m)
			byID[m.id] = m
			mu.Unlock()
			seq++
			tmu.Lock()
			tags[seq] = m
			tmu.Unlock()
			dc, err := ch.PublishWithDeferredConfirm(names[q], "", mandatory, false, amqp.Publishing{MessageId: m.id, DeliveryMode: amqp.Persistent, Body: []byte(m.id)})
			m.verdict <- dc
			if err != nil {
				t.Logf("publish: %v", err)
				break
			}
			if first {
				first = false
				started <- struct{}{}
			}
		}
		// Wait for every outstanding confirm (or give up after 60 s).
		deadline := time.After(60 * time.Second)
		for i := 0; i < inflight; i++ {
			select {
			case sem <- struct{}{}:
			case <-deadline:
				t.Logf("mandatory=%v: confirms still outstanding after 60 s", mandatory)
				_ = ch.Close()
				<-doneConf
				return
			}
		}
		_ = ch.Close()
		<-doneConf
	}
	var mq, nm []int
	for i := 0; i < nq; i++ {
		if i%2 == 0 {
			mq = append(mq, i)
		} else {
			nm = append(nm, i)
		}
	}
	// Consumers on node z and on node x (the one killed), as in the
	// reliability profile: each records what it receives and acks it.
	consumed := c.startConsumers(names, []int{6 - x - y, x}, func(q int, id string) {
		mu.Lock()
		if m := byID[id]; m != nil {
			m.inQueue++
		}
		mu.Unlock()
	})
	defer consumed.stop()
	if os.Getenv("BAREWIRE_CLUSTER_PROBE_MODE") == "transport" {
		// The bus's own publisher (Deliver: pipelined confirms, a nacked
		// message sent once more on a new channel), batches of 20 to the
		// exchanges, like the outbox relay.
		first, then := y, 0
		if os.Getenv("BAREWIRE_CLUSTER_PROBE_FAILOVER") != "" {
			// Connected to the node that is killed, as a relay may be:
			// it fails over to y and opens new channels in the window.
			first, then = x, y
		}
		tr := c.transport(first, then, os.Getenv("BAREWIRE_CLUSTER_PROBE_MANDATORY") != "")
		defer func() { _ = tr.Close() }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.deliverLoop(tr, names, sfx, stop, started, &mu, &all, byID)
		}()
		started <- struct{}{}
	}
	late := os.Getenv("BAREWIRE_CLUSTER_PROBE_LATE") != ""
	startRaw := func() {
		wg.Add(2)
		go pubLoop(true, mq)
		go pubLoop(false, nm)
		<-started
		<-started
	}
	switch {
	case os.Getenv("BAREWIRE_CLUSTER_PROBE_MODE") == "transport":
		<-started
		<-started
	case !late:
		startRaw()
	}
	// Let the publishers run for a while before the kill: wait until 300
	// acks (a late publisher starts after the kill, on new channels).
	for !late {
		mu.Lock()
		n := 0
		for _, m := range all {
			if m.acked {
				n++
			}
		}
		mu.Unlock()
		if n >= 300 {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling a counter the confirm goroutines fill
	}
	killStart := time.Now()
	c.run("kill-node", strconv.Itoa(x))
	t.Logf("round %d: kill script started at %s", r, killStart.UTC().Format("15:04:05.000"))
	t.Logf("round %d: node %d killed (script took %v)", r, x, time.Since(killStart).Round(time.Millisecond))
	if ms := envInt("BAREWIRE_CLUSTER_PROBE_STOP_MS", 0); ms > 0 {
		// A slow third node: its VM stopped for ms right after the kill,
		// so that the first election of the queues cannot get a majority
		// (what a loaded machine does by accident).
		z := 6 - x - y
		pid := c.vmPid(z)
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }() // also when the round fails
		time.Sleep(time.Duration(ms) * time.Millisecond)
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: node %d stopped for %d ms after the kill", r, z, ms)
	}
	if late {
		startRaw()
	}
	time.Sleep(6 * time.Second) // the publishing window after the kill: what is measured
	close(stop)
	wg.Wait()

	// Wait until the consumers received every acked message, or until
	// nothing new arrived for 20 s after the queues have leaders again.
	last, lastN := time.Now(), -1
	for {
		mu.Lock()
		missing, got := 0, 0
		for _, m := range all {
			if m.acked && m.inQueue == 0 {
				missing++
			}
			got += m.inQueue
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if got != lastN {
			last, lastN = time.Now(), got
		}
		if time.Since(last) > 20*time.Second {
			t.Logf("round %d: %d acked messages not received after 20 s without progress", r, missing)
			break
		}
		time.Sleep(100 * time.Millisecond) // polling counters the consumers fill
	}
	consumed.stop()
	ch, err := cy.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// Messages the stopped consumers held unacked go back to their queue
	// once the queue has processed the consumers' channels going away:
	// take what is in the queues now and twice more, a second apart.
	left := 0
	for pass := 0; pass < 3; pass++ {
		if pass > 0 {
			time.Sleep(time.Second) // no signal for "the consumers' returns are applied"
		}
		for _, q := range names {
			for {
				d, ok, err := ch.Get(q, true)
				if err != nil {
					t.Logf("get %s: %v", q, err)
					if ch, err = cy.Channel(); err != nil {
						t.Fatal(err)
					}
					break
				}
				if !ok {
					break
				}
				left++
				mu.Lock()
				if m := byID[d.MessageId]; m != nil {
					m.inQueue++
				}
				mu.Unlock()
			}
		}
	}
	if left > 0 {
		t.Logf("round %d: %d messages were still in the queues after the consumers stopped", r, left)
	}
	var res probeResult
	lostQ := map[int]bool{}
	for _, m := range all {
		res.published++
		switch {
		case m.acked:
			res.acked++
			if m.afterNack {
				res.ackedAfterNack++
			}
		case m.nacked:
			res.nacked++
		default:
			res.unconfirmed++
		}
		if m.returned != "" {
			res.returned++
		}
		if m.merged {
			res.merged++
			if m.inQueue == 0 {
				res.mergedNotInQueue++
			}
		}
		if m.deferred > 0 {
			res.deferred++
			// Every Deliver that returned nil or a RetryAfterError for
			// it had an ack for its last send: at least deferred+1 acks.
			if m.acked && m.inQueue < m.deferred+1 {
				res.caught++
			}
		}
		if m.acked && m.inQueue == 0 {
			res.lost++
			lostQ[m.queue] = true
			if m.mandatory {
				res.lostMandatory++
			}
			if m.returned != "" {
				res.lostReturned++
			}
			if m.afterNack {
				res.lostAfterNack++
			}
			res.lostAfterKill = append(res.lostAfterKill, m.confirmed.Sub(killStart))
			if res.lost <= 5 {
				res.notes = append(res.notes, fmt.Sprintf("lost %s sent %v confirmed %v after the kill (at %s), return %q",
					m.id, m.sent.Sub(killStart).Round(time.Millisecond), m.confirmed.Sub(killStart).Round(time.Millisecond), m.confirmed.UTC().Format("15:04:05.000"), m.returned))
			}
		}
		if !m.acked && m.inQueue > 0 {
			res.extra++
		}
		if m.inQueue > 1 {
			res.doubled++
		}
		if m.returned != "" && res.returned <= 3 {
			res.notes = append(res.notes, fmt.Sprintf("returned %s (%s) acked=%v inQueue=%d at %v", m.id, m.returned, m.acked, m.inQueue, m.confirmed.Sub(killStart).Round(time.Millisecond)))
		}
	}
	res.lostQueues = len(lostQ)
	for i := range names {
		_, _ = ch.QueueDelete(names[i], false, false, false)
		_ = ch.ExchangeDelete(names[i], false, false)
	}
	_ = ch.Close()
	startAt := time.Now()
	c.run("start-node", strconv.Itoa(x))
	t.Logf("round %d: node %d started again in %v", r, x, time.Since(startAt).Round(time.Second))
	return res
}

// vmPid is the pid of node n's VM, found by its distribution port
// (the cluster script's AMQP port + 20000).
func (c *probeCluster) vmPid(n int) int {
	c.t.Helper()
	_, hostPart, _ := strings.Cut(c.urls[n-1], "@")
	hostPort, _, _ := strings.Cut(hostPart, "/")
	_, port, _ := strings.Cut(hostPort, ":")
	p, _ := strconv.Atoi(port)
	out, err := exec.Command("ss", "-ltnpH", fmt.Sprintf("sport = :%d", p+20000)).Output()
	if err != nil {
		c.t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(out), "pid=")
	if !ok {
		c.t.Fatalf("node %d: no VM listens on %d", n, p+20000)
	}
	pid, _ := strconv.Atoi(strings.FieldsFunc(rest, func(r rune) bool { return r < '0' || r > '9' })[0])
	return pid
}

// probeConsumers are the probe's consumers.
type probeConsumers struct {
	conns []*amqp.Connection
	wg    sync.WaitGroup
	once  sync.Once
}

func (p *probeConsumers) stop() {
	p.once.Do(func() {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.wg.Wait()
	})
}

// startConsumers consumes every queue from each of nodes, acking each
// delivery after got.
func (c *probeCluster) startConsumers(names []string, nodes []int, got func(q int, id string)) *probeConsumers {
	pc := &probeConsumers{}
	for _, n := range nodes {
		conn, err := amqp.Dial(c.urls[n-1])
		if err != nil {
			c.t.Fatal(err)
		}
		pc.conns = append(pc.conns, conn)
		for q, name := range names {
			ch, err := conn.Channel()
			if err != nil {
				c.t.Fatal(err)
			}
			if err := ch.Qos(20, 0, false); err != nil {
				c.t.Fatal(err)
			}
			ds, err := ch.Consume(name, "", false, false, false, false, nil)
			if err != nil {
				c.t.Fatal(err)
			}
			pc.wg.Add(1)
			go func() {
				defer pc.wg.Done()
				for d := range ds {
					got(q, d.MessageId)
					_ = d.Ack(false)
				}
			}()
		}
	}
	return pc
}

// transport starts a Transport connected to node n, failing over to node
// then (none when 0).
func (c *probeCluster) transport(n, then int, mandatory bool) *Transport {
	cfg := &Config{Mandatory: mandatory, ReconnectMaxInterval: time.Second, ConnectTimeout: 10 * time.Second, PublishTimeout: 20 * time.Second,
		SuspectWindow: time.Duration(envInt("BAREWIRE_CLUSTER_PROBE_WINDOW_MS", 0)) * time.Millisecond}
	if then > 0 {
		cfg.URLs = []string{c.urls[then-1]}
	}
	tr, err := open(c.urls[n-1], cfg, testLogger(c.t))
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tr.Start(ctx, nil); err != nil {
		c.t.Fatal(err)
	}
	return tr
}

// deliverLoop publishes batches through tr.Deliver until stop, recording
// what the transport reports for each message. Like the outbox relay, it
// asks for *outbox.RetryAfterError (the suspect window) and sends such a
// message again once its After has passed, also after stop, until every
// one was confirmed outside a window: a message counts as acked only when
// Deliver returned nil for it.
func (c *probeCluster) deliverLoop(tr *Transport, names []string, sfx string, stop chan struct{}, started chan struct{}, mu *sync.Mutex, all *[]*probeMsg, byID map[string]*probeMsg) {
	every := time.Duration(envInt("BAREWIRE_CLUSTER_PROBE_EVERY_US", 2000)) * time.Microsecond
	tick := time.NewTicker(every * 20)
	defer tick.Stop()
	type retry struct {
		m   *probeMsg
		msg *outbox.Message
		at  time.Time
	}
	var later []retry
	deferred, resent := 0, 0
	defer func() {
		c.t.Logf("deliver loop: %d publishes not trusted (suspect window), %d sends again", deferred, resent)
	}()
	first, stopped := true, false
	for k := 0; ; {
		if stopped && len(later) == 0 {
			return
		}
		select {
		case <-stop:
			stop, stopped = nil, true
			continue
		case <-tick.C:
		}
		var batch []*outbox.Message
		var ms []*probeMsg
		now := time.Now()
		keep := later[:0]
		for _, r := range later {
			if now.Before(r.at) || len(batch) == 20 {
				keep = append(keep, r)
				continue
			}
			batch, ms = append(batch, r.msg), append(ms, r.m)
			resent++
		}
		later = keep
		for len(batch) < 20 && !stopped {
			q := k % len(names)
			m := &probeMsg{id: fmt.Sprintf("%s-%d-%d", sfx, q, k), queue: q, mandatory: tr.cfg.Mandatory, sent: time.Now()}
			k++
			mu.Lock()
			*all = append(*all, m)
			byID[m.id] = m
			mu.Unlock()
			ms = append(ms, m)
			batch = append(batch, &outbox.Message{MessageID: m.id, Destination: "exchange:" + names[q], Payload: []byte(m.id)})
		}
		if len(batch) == 0 {
			continue
		}
		if first {
			first = false
			started <- struct{}{}
		}
		errs := tr.Deliver(outbox.WithRetryAfter(context.Background()), batch)
		now = time.Now()
		mu.Lock()
		for i, err := range errs {
			m := ms[i]
			m.confirmed = now
			var re *ReturnedError
			var ra *outbox.RetryAfterError
			switch {
			case err == nil:
				m.acked = true
			case errors.As(err, &ra):
				deferred++
				m.deferred++
				later = append(later, retry{m: m, msg: batch[i], at: now.Add(ra.After)})
			case errors.As(err, &re):
				m.returned = fmt.Sprintf("%d %s", re.Code, re.Text)
			default:
				m.nacked = true
			}
		}
		mu.Unlock()
	}
}

// probePrefix is the cluster script's node name prefix.
func probePrefix() string {
	if p := os.Getenv("BAREWIRE_CLUSTER_PREFIX"); p != "" {
		return p
	}
	return "bwc"
}
