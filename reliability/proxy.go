package reliability

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
)

// Proxy is a TCP proxy between one service process and the broker. It lets
// the harness cut that process's broker connections at the TCP level even
// while the process is frozen (SIGSTOP): the broker sees the connection
// drop at once and requeues the process's unacknowledged messages, which
// rabbitmqctl close_connection cannot achieve against a frozen client (the
// broker then waits for the client's close-ok).
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on a free local port and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// ProxiedURL returns rawURL with its host and port replaced by the proxy's.
func (p *Proxy) ProxiedURL(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("reliability: cannot parse the AMQP URL") // never quote it: it has a password
	}
	u.Host = p.Addr()
	return u.String(), nil
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			_ = c.Close()
			_ = up.Close()
			return
		}
		p.wg.Go(func() { p.pipe(c, up) })
		p.wg.Go(func() { p.pipe(up, c) })
	}
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies until either side fails, then closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// CloseConns closes every connection through the proxy (both sides) and
// returns how many client connections it cut. New connections are accepted
// as before.
func (p *Proxy) CloseConns() int {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return len(conns) / 2
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.CloseConns()
	p.wg.Wait()
}
