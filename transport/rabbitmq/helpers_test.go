package rabbitmq

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
)

const urlEnv = "BAREWIRE_TEST_AMQP_URL"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// brokerURL returns the test broker's URL or skips the test.
func brokerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(urlEnv)
	if u == "" {
		t.Skipf("set %s (e.g. amqp://guest:guest@127.0.0.1:5672/) to run the RabbitMQ integration tests", urlEnv)
	}
	return u
}

// uniq returns prefix with a random suffix.
func uniq(prefix string) string {
	return fmt.Sprintf("bwtest.%s.%08x", prefix, rand.Uint32())
}

// testLogger logs to the test output at Warn and above (Debug with -v and
// BAREWIRE_TEST_DEBUG set).
func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("BAREWIRE_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var _ io.Writer = tWriter{}

// newEndpoint declares one endpoint named name whose raw consumer handles
// types (a catch-all when types is empty), then applies configure.
func newEndpoint(t testing.TB, name string, types []string, configure func(e *endpoint.Endpoint)) *endpoint.Endpoint {
	t.Helper()
	var eps endpoint.Endpoints
	eps.ReceiveEndpoint(name, func(e *endpoint.Endpoint) {
		var opts []endpoint.ConsumerOption
		if len(types) > 0 {
			opts = append(opts, endpoint.ForTypes(types...))
		}
		endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil }, opts...)
		if configure != nil {
			configure(e)
		}
	})
	if errs := eps.Errs(); len(errs) > 0 {
		t.Fatalf("endpoint %s: %v", name, errs)
	}
	return eps.List()[0]
}

// startTransport creates and starts a transport; it is closed at cleanup.
func startTransport(t testing.TB, cfg *Config, eps ...*endpoint.Endpoint) *Transport {
	t.Helper()
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.ReconnectMaxInterval == 0 {
		cfg.ReconnectMaxInterval = time.Second
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	tr, err := open(brokerURL(t), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tr.Start(ctx, eps); err != nil {
		t.Fatalf("start: %v", err)
	}
	return tr
}

// plain is a plain amqp091 client for checking what is on the broker.
type plain struct {
	t    testing.TB
	conn *amqp.Connection
}

func newPlain(t testing.TB) *plain {
	t.Helper()
	conn, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &plain{t: t, conn: conn}
}

// ch returns a fresh channel (closed at cleanup).
func (p *plain) ch() *amqp.Channel {
	p.t.Helper()
	ch, err := p.conn.Channel()
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// cleanupQueues deletes queues at the end of the test.
func (p *plain) cleanupQueues(names ...string) {
	p.t.Cleanup(func() {
		for _, n := range names {
			if ch, err := p.conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(n, false, false, false)
				_ = ch.Close()
			}
		}
	})
}

// cleanupExchanges deletes exchanges at the end of the test.
func (p *plain) cleanupExchanges(names ...string) {
	p.t.Cleanup(func() {
		for _, n := range names {
			if ch, err := p.conn.Channel(); err == nil {
				_ = ch.ExchangeDelete(n, false, false)
				_ = ch.Close()
			}
		}
	})
}

// get fetches one message from queue, waiting up to 5s.
func (p *plain) get(queue string) amqp.Delivery {
	p.t.Helper()
	ch := p.ch()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			p.t.Fatalf("get %s: %v", queue, err)
		}
		if ok {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.t.Fatalf("no message in %s", queue)
	return amqp.Delivery{}
}

// count returns the number of ready messages in queue.
func (p *plain) count(queue string) int {
	p.t.Helper()
	ch := p.ch()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		p.t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages
}

// publish publishes with a plain client, with confirms.
func (p *plain) publish(exchange, key string, msg amqp.Publishing) {
	p.t.Helper()
	ch := p.ch()
	if err := ch.Confirm(false); err != nil {
		p.t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, msg)
	if err != nil {
		p.t.Fatal(err)
	}
	if !dc.Wait() {
		p.t.Fatal("plain publish nacked")
	}
}

// receive reads one message from out within d.
func receive(t testing.TB, out <-chan *message.Message, d time.Duration) *message.Message {
	t.Helper()
	select {
	case m, ok := <-out:
		if !ok {
			t.Fatal("subscription closed")
		}
		return m
	case <-time.After(d):
		t.Fatal("timed out waiting for a message")
	}
	return nil
}

// closeConnection closes the transport's current connection from the broker
// side, with rabbitmqctl, as an operator or a network fault would.
func closeConnection(t testing.TB, tr *Transport) {
	t.Helper()
	tr.mu.Lock()
	conn := tr.conn
	tr.mu.Unlock()
	if conn == nil {
		t.Fatal("transport not connected")
	}
	name := fmt.Sprintf("%s -> %s", conn.LocalAddr(), conn.RemoteAddr())
	out, err := exec.Command("rabbitmqctl", "list_connections", "--quiet", "--no-table-headers", "pid", "name").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	pid := ""
	for _, line := range strings.Split(string(out), "\n") {
		p, n, ok := strings.Cut(line, "\t")
		if ok && strings.TrimSpace(n) == name {
			pid = strings.TrimSpace(p)
		}
	}
	if pid == "" {
		t.Fatalf("connection %q not listed by rabbitmqctl:\n%s", name, out)
	}
	out, err = exec.Command("rabbitmqctl", "close_connection", pid, "test").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl close_connection %s: %v\n%s", pid, err, out)
	}
	t.Logf("closed connection %q with rabbitmqctl", name)
}

// idSet collects message ids safely.
type idSet struct {
	mu  sync.Mutex
	ids map[string]int
}

func (s *idSet) add(id string) {
	s.mu.Lock()
	if s.ids == nil {
		s.ids = map[string]int{}
	}
	s.ids[id]++
	s.mu.Unlock()
}

func (s *idSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// open builds a transport the way bus.New does, from a copy of cfg (nil:
// all defaults).
func open(rawURL string, cfg *Config, logger *slog.Logger) (*Transport, error) {
	t := New(rawURL, func(c *Config) {
		if cfg != nil {
			*c = *cfg
		}
	})
	if _, err := t.Build(transport.Env{Logger: logger}); err != nil {
		return nil, err
	}
	return t, nil
}
