package tcpproxy_test

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/internal/tcpproxy"
)

// TestCut: bytes flow both ways through the proxy; Cut ends the client's
// connection (its read fails) and a new one works.
func TestCut(t *testing.T) {
	p, err := tcpproxy.New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	echo := func(c net.Conn) error {
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		l, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && l != "ping\n" {
			t.Fatalf("echo %q", l)
		}
		return err
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut cut %d connections, want 1", n)
	}
	if err := echo(c); err == nil {
		t.Fatal("the cut connection still works")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := echo(c2); err != nil {
		t.Fatalf("a new connection after Cut: %v", err)
	}

	// Down: the open connection ends and new ones are refused until Up.
	if n := p.Down(); n != 1 {
		t.Fatalf("Down cut %d connections, want 1", n)
	}
	if err := echo(c2); err == nil {
		t.Fatal("a connection still works after Down")
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := echo(c3); err == nil {
		t.Fatal("a new connection works while the proxy is down")
	}
	p.Up()
	c4, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	if err := echo(c4); err != nil {
		t.Fatalf("a new connection after Up: %v", err)
	}
}

// TestFreeze: while frozen nothing crosses the proxy and nothing is
// closed; Thaw delivers what was held, in order, and traffic flows again.
func TestFreeze(t *testing.T) {
	p, err := tcpproxy.New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if l, err := r.ReadString('\n'); err != nil || l != "one\n" {
		t.Fatalf("before Freeze: %q, %v", l, err)
	}
	p.Freeze()
	if _, err := c.Write([]byte("two\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if l, err := r.ReadString('\n'); err == nil {
		t.Fatalf("read %q through a frozen proxy", l)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read through a frozen proxy: %v, want a timeout (nothing closed)", err)
	}
	p.Thaw()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, err := r.ReadString('\n'); err != nil || l != "two\n" {
		t.Fatalf("after Thaw: %q, %v; want the held line", l, err)
	}
}

// TestForURL: the proxied URL keeps everything but the host, and a URL
// without a host is refused without being quoted (it may hold a password).
func TestForURL(t *testing.T) {
	p, proxied, err := tcpproxy.ForURL("amqp://guest:secret@127.0.0.1:5672/vhost?heartbeat=5")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if want := "amqp://guest:secret@" + p.Addr() + "/vhost?heartbeat=5"; proxied != want {
		t.Fatalf("proxied %q, want %q", proxied, want)
	}
	if _, _, err := tcpproxy.ForURL("not a url with secret"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("err %v: want an error that does not quote the URL", err)
	}
}

// echoServer listens on a free port of 127.0.0.1 until t ends, echoing
// every line each connection sends, and returns its address.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					_, _ = c.Write([]byte(l))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestBlock: while blocked the server receives nothing from the client but
// its own bytes still reach the client (a broker in a resource alarm
// sending heartbeats); Unblock delivers what was held.
func TestBlock(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 4)
	say := make(chan string)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		go func() {
			for s := range say {
				_, _ = c.Write([]byte(s))
			}
		}()
		r := bufio.NewReader(c)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			got <- l
		}
	}()
	defer close(say)
	p, err := tcpproxy.New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l != "one\n" {
		t.Fatalf("before Block the server got %q", l)
	}
	p.Block()
	if _, err := c.Write([]byte("two\n")); err != nil {
		t.Fatal(err)
	}
	say <- "beat\n"
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, err := r.ReadString('\n'); err != nil || l != "beat\n" {
		t.Fatalf("the server's bytes while blocked: %q, %v", l, err)
	}
	select {
	case l := <-got:
		t.Fatalf("the server got %q through a blocked proxy", l)
	case <-time.After(300 * time.Millisecond):
	}
	p.Unblock()
	select {
	case l := <-got:
		if l != "two\n" {
			t.Fatalf("after Unblock the server got %q; want the held line", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("after Unblock the server did not get the held line")
	}
}
