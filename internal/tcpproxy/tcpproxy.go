// Package tcpproxy is a TCP proxy for tests that must cut a client's
// connections to a server as a network failure would: the conformance
// suites' reconnect case for transports whose client gives no way to drop
// its connection (the Watermill presets), the reliability harness's
// broker-close and stop-cont faults, and the bus's database-outage tests
// (Down and Up: a server that went away and came back), and a server that
// stops answering without closing anything (Freeze and Thaw: a broker
// blocking its publishers in a resource alarm, a partition without resets).
package tcpproxy

import (
	"errors"
	"net"
	"net/url"
	"sync"
)

// Proxy forwards every connection accepted on a local port to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	closed    bool
	down      bool          // refuse new connections
	thawed    chan struct{} // closed while bytes flow; open while frozen
	unblocked chan struct{} // closed while clients' bytes flow; open while blocked
	wg        sync.WaitGroup
}

// New listens on a free port of 127.0.0.1 and forwards to target
// (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, thawed: make(chan struct{}), unblocked: make(chan struct{})}
	close(p.thawed)
	close(p.unblocked)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// ForURL proxies the server of rawURL (its host:port) and returns the
// proxy and rawURL with its host replaced by the proxy's.
func ForURL(rawURL string) (*Proxy, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, "", errors.New("tcpproxy: cannot parse the server URL") // never quote it: it may hold a password
	}
	p, err := New(u.Host)
	if err != nil {
		return nil, "", err
	}
	return p, p.URL(u), nil
}

// URL returns u with its host replaced by the proxy's.
func (p *Proxy) URL(u *url.URL) string {
	v := *u
	v.Host = p.Addr()
	return v.String()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = up.Close()
			return
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up, false)
		go p.pipe(up, c, true)
	}
}

// pipe copies src to dst; upstream is the client-to-server direction,
// which Block holds.
func (p *Proxy) pipe(dst, src net.Conn, upstream bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			// Frozen: hold what was read until Thaw (or the connection
			// is cut, which ends the write below).
			p.mu.Lock()
			thawed, unblocked := p.thawed, p.unblocked
			p.mu.Unlock()
			<-thawed
			if upstream {
				<-unblocked
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes every connection through the proxy, both sides, and returns
// how many client connections it cut. New connections are accepted.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	// Forgotten now, not when their pipes notice: a Cut or Down right
	// after must not count them again (TestCut once saw Down count the
	// pair an earlier Cut had closed).
	clear(p.conns)
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return len(conns) / 2
}

// Down cuts every connection, as Cut does, and refuses new ones until Up:
// the server is unreachable. It returns how many client connections it
// cut.
func (p *Proxy) Down() int {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	return p.Cut()
}

// Up accepts connections again after Down.
func (p *Proxy) Up() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Freeze stops forwarding bytes in both directions without closing
// anything: the server looks alive to the kernel but never answers, and
// once the buffers fill the client's writes block. Thaw resumes.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default: // frozen already
	}
}

// Thaw forwards again what Freeze held, and everything after it.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

// Block holds every byte clients send until Unblock, while the server's
// bytes still reach them: a RabbitMQ broker in a resource alarm stops
// reading from a publishing connection but keeps sending it heartbeats,
// so the client's writes block once the buffers fill and nothing times
// out on its side.
func (p *Proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.unblocked:
		p.unblocked = make(chan struct{})
	default: // blocked already
	}
}

// Unblock forwards again what Block held, and everything after it.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.unblocked:
	default:
		close(p.unblocked)
	}
}

// Close stops accepting, cuts every connection and waits for the
// proxy's goroutines (a frozen or blocked proxy thaws first, so that they
// end).
func (p *Proxy) Close() {
	p.Thaw()
	p.Unblock()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
