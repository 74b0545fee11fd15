//go:build linux

package reliability

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Log messages of cmd/barewire-testsvc the harness reacts to.
const (
	logReady            = "ready"
	logStats            = "stats"
	logProducerDone     = "producer done"
	logKillAfterConfirm = "kill-after-confirm"
	logFenced           = "inbox fencing refused a late commit"
)

// maxStillborn bounds how many incarnations in a row may die before they
// are ready before the supervisor gives up (a process that cannot start).
// Processes killed after they were ready (by the harness, or by their own
// kill-after-confirm hook) are restarted without limit.
const maxStillborn = 20

// ProcSpec describes one supervised service process.
type ProcSpec struct {
	// Name names the process in logs and summaries ("consumer-1").
	Name string
	// Args are the service's command-line arguments.
	Args []string
	// Env are extra KEY=VALUE environment entries (credentials go here,
	// never on the command line).
	Env []string
}

// Proc supervises one service process: it starts it, reads its JSON log,
// and restarts it whenever it exits unless it was stopped or exited 0 (a
// producer that finished its work).
type Proc struct {
	spec   ProcSpec
	bin    string
	logDir string

	mu       sync.Mutex
	incs     []*incarnation
	stopping bool
	done     chan struct{} // closed when the supervisor ends
	finalErr error         // why the supervisor ended, when not stopped
	signaled map[string]int
}

// incarnation is one run of the process.
type incarnation struct {
	n      int
	cmd    *exec.Cmd
	ready  chan struct{}
	exited chan struct{}
	state  *os.ProcessState

	mu           sync.Mutex
	isReady      bool
	stats        map[string]any
	selfKills    int
	fenced       int
	producerDone bool
	errorLines   []string
}

// StartProc starts a supervised process.
func StartProc(bin, logDir string, spec ProcSpec) (*Proc, error) {
	p := &Proc{spec: spec, bin: bin, logDir: logDir, done: make(chan struct{}), signaled: map[string]int{}}
	inc, err := p.spawn()
	if err != nil {
		return nil, err
	}
	go p.supervise(inc)
	return p, nil
}

// Name is the spec's name.
func (p *Proc) Name() string { return p.spec.Name }

func (p *Proc) spawn() (*incarnation, error) {
	p.mu.Lock()
	n := len(p.incs) + 1
	p.mu.Unlock()
	logFile, err := os.Create(filepath.Join(p.logDir, fmt.Sprintf("%s.%03d.log", p.spec.Name, n)))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(p.bin, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.Stdout = logFile
	// Its own process group keeps a Ctrl-C of the test from reaching it
	// first; Pdeathsig kills it if the test process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", p.spec.Name, err)
	}
	inc := &incarnation{n: n, cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{})}
	p.mu.Lock()
	p.incs = append(p.incs, inc)
	p.mu.Unlock()
	go func() {
		inc.read(stderr, logFile)
		err := cmd.Wait() // after the pipe is drained, as os/exec requires
		logFile.Close()
		inc.mu.Lock()
		inc.state = cmd.ProcessState
		inc.mu.Unlock()
		_ = err // the state says everything
		close(inc.exited)
	}()
	return inc, nil
}

// read copies the log to w and records what the harness needs from it.
func (inc *incarnation) read(r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Bytes()
		_, _ = w.Write(append(line, '\n'))
		var rec map[string]any
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		msg, _ := rec["msg"].(string)
		inc.mu.Lock()
		switch msg {
		case logReady:
			if !inc.isReady {
				inc.isReady = true
				close(inc.ready)
			}
		case logStats:
			inc.stats = rec
		case logKillAfterConfirm:
			inc.selfKills++
		case logFenced:
			inc.fenced++
		case logProducerDone:
			inc.producerDone = true
		}
		if lvl, _ := rec["level"].(string); lvl == "ERROR" {
			if len(inc.errorLines) >= 20 {
				inc.errorLines = inc.errorLines[1:]
			}
			inc.errorLines = append(inc.errorLines, string(line))
		}
		inc.mu.Unlock()
	}
	// Drain the rest so that the process never blocks on a full pipe.
	_, _ = io.Copy(w, r)
}

func (p *Proc) supervise(inc *incarnation) {
	defer close(p.done)
	stillborn := 0
	for {
		<-inc.exited
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping {
			return
		}
		if inc.state != nil && inc.state.Success() {
			return // finished its work (a producer)
		}
		inc.mu.Lock()
		wasReady := inc.isReady
		inc.mu.Unlock()
		if wasReady {
			stillborn = 0
		} else if stillborn++; stillborn >= maxStillborn {
			p.mu.Lock()
			p.finalErr = fmt.Errorf("%s: gave up after %d incarnations in a row died before they were ready (%v)%s", p.spec.Name, stillborn, inc.state, p.errorTailLocked())
			p.mu.Unlock()
			return
		}
		// A short pause so that a process that dies at start does not spin.
		time.Sleep(200 * time.Millisecond)
		p.mu.Lock()
		stopping = p.stopping
		p.mu.Unlock()
		if stopping {
			return
		}
		next, err := p.spawn()
		if err != nil {
			p.mu.Lock()
			p.finalErr = err
			p.mu.Unlock()
			return
		}
		inc = next
	}
}

func (p *Proc) current() *incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.incs[len(p.incs)-1]
}

// Incarnation returns the number of the current incarnation (1 for the
// first start).
func (p *Proc) Incarnation() int { return p.current().n }

// Pid returns the OS pid of the current incarnation.
func (p *Proc) Pid() int { return p.current().cmd.Process.Pid }

// WaitReady waits until the current incarnation (or, if it dies first, a
// later one) logged "ready".
func (p *Proc) WaitReady(ctx context.Context) error {
	for {
		inc := p.current()
		select {
		case <-inc.ready:
			return nil
		case <-inc.exited:
			select {
			case <-p.done:
				return fmt.Errorf("%s exited before it was ready (%v)%s", p.spec.Name, inc.state, p.errorTail())
			default:
			}
			// The supervisor restarts it; wait for the next incarnation.
			if err := p.waitIncarnation(ctx, inc.n+1); err != nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w%s", p.spec.Name, ctx.Err(), p.errorTail())
		}
	}
}

// waitIncarnation waits until incarnation n exists. The supervisor creates
// it; there is no event to wait on besides polling the list.
func (p *Proc) waitIncarnation(ctx context.Context, n int) error {
	for p.current().n < n {
		select {
		case <-p.done:
			return fmt.Errorf("%s: supervisor ended: %v", p.spec.Name, p.finalErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Signal sends sig to the current incarnation and counts it.
func (p *Proc) Signal(sig syscall.Signal) (*incarnation, error) {
	inc := p.current()
	if err := inc.cmd.Process.Signal(sig); err != nil {
		return inc, err
	}
	p.mu.Lock()
	p.signaled[sig.String()]++
	p.mu.Unlock()
	return inc, nil
}

// Kill SIGKILLs the current incarnation and waits until its successor is
// ready. When the current incarnation has just died by itself (a relay's
// kill-after-confirm), it waits for the successor and kills that one.
func (p *Proc) Kill(ctx context.Context) error {
	for {
		inc, err := p.Signal(syscall.SIGKILL)
		if errors.Is(err, os.ErrProcessDone) {
			select {
			case <-p.done:
				return errStopped
			default:
			}
			if err := p.waitIncarnation(ctx, inc.n+1); err != nil {
				return err
			}
			if err := p.WaitReady(ctx); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		select {
		case <-inc.exited:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-p.done: // it was not to be restarted (stopping, or finished)
			return nil
		default:
		}
		if err := p.waitIncarnation(ctx, inc.n+1); err != nil {
			return err
		}
		return p.WaitReady(ctx)
	}
}

// Done is closed when the process has ended for good: stopped, finished
// (exit 0), or given up on.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is why the supervisor gave up, if it did.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.finalErr
}

// Stop stops the process gracefully (SIGTERM), and SIGKILLs it when ctx
// ends first. A stopped process is not restarted.
func (p *Proc) Stop(ctx context.Context) error {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	for {
		// The supervisor may have spawned a successor just before it saw
		// stopping: signal whichever incarnation is current.
		inc := p.current()
		select {
		case <-inc.exited:
			select {
			case <-p.done:
				return nil
			case <-time.After(10 * time.Millisecond):
			}
			continue
		default:
		}
		// Wake it first in case a fault left it stopped.
		_ = inc.cmd.Process.Signal(syscall.SIGCONT)
		_ = inc.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return nil
		case <-inc.exited:
		case <-ctx.Done():
			_ = p.current().cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
			return fmt.Errorf("%s did not stop gracefully in time; killed", p.spec.Name)
		}
	}
}

// ProcStats are one process's counters, summed over its incarnations.
type ProcStats struct {
	Name string
	// Incarnations counts starts (1 + restarts).
	Incarnations int
	// Signals counts signals sent by the harness, by name.
	Signals map[string]int
	// SelfKills counts kill-after-confirm suicides.
	SelfKills int
	// Fenced counts late commits refused by the inbox's lock token.
	Fenced int
	// Counters sums the last "stats" line of each incarnation; the counts
	// of a killed incarnation stop at its last report (at most one stats
	// interval old), so they are lower bounds.
	Counters map[string]int64
	// ProducerDone is true when the last incarnation finished producing.
	ProducerDone bool
	// ErrorLines are the last ERROR log lines of the last incarnations.
	ErrorLines []string
}

// Stats returns the process's counters.
func (p *Proc) Stats() ProcStats {
	p.mu.Lock()
	incs := append([]*incarnation(nil), p.incs...)
	st := ProcStats{Name: p.spec.Name, Incarnations: len(incs), Signals: map[string]int{}, Counters: map[string]int64{}}
	for k, v := range p.signaled {
		st.Signals[k] = v
	}
	p.mu.Unlock()
	for _, inc := range incs {
		inc.mu.Lock()
		st.SelfKills += inc.selfKills
		st.Fenced += inc.fenced
		for k, v := range inc.stats {
			if f, ok := v.(float64); ok {
				st.Counters[k] += int64(f)
			}
		}
		st.ProducerDone = inc.producerDone
		st.ErrorLines = append(st.ErrorLines, inc.errorLines...)
		inc.mu.Unlock()
	}
	if len(st.ErrorLines) > 20 {
		st.ErrorLines = st.ErrorLines[len(st.ErrorLines)-20:]
	}
	return st
}

// LastCounter returns a counter from the current incarnation's last stats
// line (0 if none yet).
func (p *Proc) LastCounter(name string) int64 {
	inc := p.current()
	inc.mu.Lock()
	defer inc.mu.Unlock()
	f, _ := inc.stats[name].(float64)
	return int64(f)
}

// errorTailLocked is errorTail of the last incarnation, for callers that
// hold p.mu.
func (p *Proc) errorTailLocked() string {
	inc := p.incs[len(p.incs)-1]
	inc.mu.Lock()
	defer inc.mu.Unlock()
	if len(inc.errorLines) == 0 {
		return ""
	}
	return "\nlast errors:\n" + joinLines(inc.errorLines)
}

func (p *Proc) errorTail() string {
	st := p.Stats()
	if len(st.ErrorLines) == 0 {
		return ""
	}
	return "\nlast errors:\n" + joinLines(st.ErrorLines)
}

func joinLines(lines []string) string {
	var b []byte
	for _, l := range lines {
		b = append(b, "  "...)
		b = append(b, l...)
		b = append(b, '\n')
	}
	return string(b)
}

// errStopped is returned by faults aimed at a process that ended.
var errStopped = errors.New("process has ended")
