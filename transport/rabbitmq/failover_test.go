package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
)

// freeAddr returns a local address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// brokerParts splits the test broker's URL into credentials and host:port.
func brokerParts(t *testing.T) (creds, host string) {
	target := strings.TrimPrefix(brokerURL(t), "amqp://")
	creds, hostPart, ok := strings.Cut(target, "@")
	if !ok {
		t.Skip("needs a URL with credentials")
	}
	host, _, _ = strings.Cut(hostPart, "/")
	return creds, host
}

// TestFailoverToNextAddress runs two "nodes" (two proxies to the test
// broker): losing the node the transport is connected to makes it connect
// to the other at once, consume again and publish; Node and HealthDetails
// follow.
func TestFailoverToNextAddress(t *testing.T) {
	creds, host := brokerParts(t)
	addrA, addrB := freeAddr(t), freeAddr(t)
	proxyA := startProxyLater(t, addrA, host, 0)
	proxyB := startProxyLater(t, addrB, host, 0)
	defer proxyB.stop()
	urlA := "amqp://" + creds + "@" + addrA + "/"
	urlB := "amqp://" + creds + "@" + addrB + "/"

	pl := newPlain(t)
	queue := uniq("failover")
	pl.cleanupQueues(queue, wire.ErrorQueue(queue))
	ep := newEndpoint(t, queue, nil, nil)
	var tr *Transport
	deadline := time.Now().Add(5 * time.Second)
	for { // the proxies listen within moments
		var err error
		// A short suspect window: send waits it out after the start and
		// the failover (Deliver without the relay), and this test times
		// the failover, not the window (TestSuspectWindow* test that).
		tr, err = open(urlA, &Config{URLs: []string{urlB}, ConnectTimeout: 5 * time.Second, ReconnectMaxInterval: time.Second,
			SuspectWindow: 300 * time.Millisecond}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		if err = tr.Start(context.Background(), []*endpoint.Endpoint{ep}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
		_ = tr.Close()
	}
	defer tr.Close()
	if got := tr.Node(); !strings.Contains(got, addrA) {
		t.Fatalf("connected to %q, want the first address %s", got, addrA)
	}
	if d := tr.HealthDetails(); d["node"] != tr.Node() || len(d["addresses"].([]string)) != 2 {
		t.Errorf("HealthDetails = %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, err := tr.Subscriber().Subscribe(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	send := func(id string) {
		t.Helper()
		for i := 0; ; i++ {
			err := tr.Deliver(context.Background(), []*outbox.Message{{MessageID: id, Destination: "queue:" + queue}})[0]
			if err == nil {
				return
			}
			if !errors.Is(err, outbox.ErrTransportUnavailable) || i > 100 {
				t.Fatalf("deliver %s: %v", id, err)
			}
			time.Sleep(50 * time.Millisecond) // the outbox relay's retry, in short
		}
	}
	send("before")
	if m := receive(t, out, 5*time.Second); m.UUID != "before" {
		t.Fatalf("got %q", m.UUID)
	} else {
		m.Ack()
	}

	lost := time.Now()
	proxyA.stop() // node A goes away, and stays away
	send("after")
	var m = receive(t, out, 10*time.Second)
	for m.UUID == "before" {
		// Its ack may have been lost with the node: redelivered, as
		// at-least-once allows (an inbox absorbs it).
		m.Ack()
		m = receive(t, out, 10*time.Second)
	}
	took := time.Since(lost)
	if m.UUID != "after" {
		t.Fatalf("got %q", m.UUID)
	}
	m.Ack()
	t.Logf("failed over and consumed again %v after the node was lost", took.Round(time.Millisecond))
	if got := tr.Node(); !strings.Contains(got, addrB) {
		t.Errorf("connected to %q after failover, want %s", got, addrB)
	}
	if tr.Connects() != 2 {
		t.Errorf("connects = %d, want 2", tr.Connects())
	}
	if took > 5*time.Second {
		t.Errorf("failover took %v", took)
	}
	if err := tr.Health(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestNoAddressAnswers: Start fails naming every address with its own
// error, without a password; Health while reconnecting does the same.
func TestNoAddressAnswers(t *testing.T) {
	brokerURL(t)
	const pw = "n0t-the-real-pw"
	a1, a2 := freeAddr(t), freeAddr(t)
	tr, err := open(fmt.Sprintf("amqp://guest:%s@%s/,amqp://guest:%s@%s/", pw, a1, pw, a2), &Config{ConnectTimeout: time.Second}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	err = tr.Start(context.Background(), nil)
	if err == nil {
		t.Fatal("started with no broker")
	}
	msg := err.Error()
	t.Log(msg)
	if strings.Contains(msg, pw) {
		t.Errorf("error leaks the password: %s", msg)
	}
	for _, want := range []string{"any of 2 broker addresses", "guest:xxxxx@" + a1 + "/: dial tcp " + a1, "guest:xxxxx@" + a2 + "/: dial tcp " + a2, "connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	var oerr *net.OpError
	if !errors.As(err, &oerr) {
		t.Error("errors.As does not reach the dial error")
	}
}

// TestHealthNamesEveryAddressWhileReconnecting: after the only node goes
// away, Health's error lists each address tried with its error.
func TestHealthNamesEveryAddressWhileReconnecting(t *testing.T) {
	creds, host := brokerParts(t)
	addrA, addrB := freeAddr(t), freeAddr(t) // B never answers
	proxyA := startProxyLater(t, addrA, host, 0)
	var tr *Transport
	var err error
	tr, err = open("amqp://"+creds+"@"+addrA+"/,amqp://"+creds+"@"+addrB+"/", &Config{ConnectTimeout: 5 * time.Second, ReconnectMaxInterval: 200 * time.Millisecond}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	proxyA.stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := tr.Health(context.Background())
		if err != nil && strings.Contains(err.Error(), "last attempt") {
			t.Log(err)
			for _, want := range []string{addrA, addrB, "2 addresses tried", "connection refused"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("health error lacks %q: %v", want, err)
				}
			}
			if !errors.Is(err, outbox.ErrTransportUnavailable) {
				t.Errorf("health error does not wrap ErrTransportUnavailable: %v", err)
			}
			if tr.Node() != "" {
				t.Errorf("Node() = %q while disconnected", tr.Node())
			}
			if !strings.Contains(err.Error(), "no connection for ") {
				t.Errorf("health error does not say how long the transport has been disconnected: %v", err)
			}
			d := tr.HealthDetails()
			if d["node"] != "" || len(d["addresses"].([]string)) != 2 {
				t.Errorf("health details while no node answers: %v", d)
			}
			if s, _ := d["disconnectedForSeconds"].(float64); s <= 0 {
				t.Errorf("health details lack disconnectedForSeconds: %v", d)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health after the node went away: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestQuorumDefaults: Config.QueueType makes every endpoint queue and its
// error queue quorum queues; a message requeued more than DeliveryLimit
// times is dead-lettered by the broker into the error queue, not dropped.
func TestQuorumDefaults(t *testing.T) {
	pl := newPlain(t)
	queue := uniq("qqdefault")
	pl.cleanupQueues(queue, wire.ErrorQueue(queue))
	ep := newEndpoint(t, queue, nil, nil)
	tr := startTransport(t, &Config{QueueType: endpoint.Quorum, DeliveryLimit: 2}, ep)

	for _, q := range []endpoint.Queue{tr.endpointQueue(ep), tr.errorQueue(ep)} {
		// Redeclared with the same arguments but as classic: refused over
		// the type alone.
		args := queueArgs(q)
		args["x-queue-type"] = "classic"
		_, err := pl.ch().QueueDeclare(q.Name, true, false, false, false, args)
		if err == nil || !strings.Contains(err.Error(), "x-queue-type") || !strings.Contains(err.Error(), "quorum") {
			t.Errorf("%s is not a quorum queue: %v", q.Name, err)
		}
	}
	if q := tr.endpointQueue(ep); q.Args["x-delivery-limit"] != int64(2) || q.Args["x-dead-letter-routing-key"] != wire.ErrorQueue(queue) ||
		q.Args["x-dead-letter-strategy"] != "at-least-once" || q.Args["x-overflow"] != "reject-publish" {
		t.Errorf("endpoint queue arguments: %v", q.Args)
	}
	// Redeclaring with the same settings is a no-op: a restart works.
	if err := tr.declareTopology(tr.conn); err != nil {
		t.Fatalf("redeclare: %v", err)
	}

	if err := tr.Deliver(context.Background(), []*outbox.Message{{MessageID: "poison", Destination: "queue:" + queue}})[0]; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, err := tr.Subscriber().Subscribe(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	// Delivered once, then returned twice (the limit): the third return
	// dead-letters it.
	for i := 0; i < 3; i++ {
		m := receive(t, out, 5*time.Second)
		if m.UUID != "poison" {
			t.Fatalf("got %q", m.UUID)
		}
		m.Nack()
	}
	deadline := time.Now().Add(5 * time.Second)
	for pl.count(wire.ErrorQueue(queue)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the message over the delivery limit did not reach the error queue")
		}
		time.Sleep(50 * time.Millisecond)
	}
	d := pl.get(wire.ErrorQueue(queue))
	if d.MessageId != "poison" {
		t.Errorf("error queue holds %q", d.MessageId)
	}
	if deaths, _ := d.Headers["x-death"].([]any); len(deaths) == 0 || !strings.Contains(fmt.Sprint(deaths[0]), "delivery_limit") {
		t.Errorf("x-death = %v, want reason delivery_limit", d.Headers["x-death"])
	}
	if pl.count(queue) != 0 {
		t.Errorf("%d left in the queue", pl.count(queue))
	}
}
