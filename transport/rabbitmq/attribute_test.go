package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// currentConnForTest returns the transport's connection, failing the test
// when there is none.
func currentConnForTest(t *testing.T, tr *Transport) any {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.conn == nil || tr.conn.IsClosed() {
		t.Fatal("transport not connected")
	}
	return tr.conn
}

// TestUnencodableMessageFailsAloneAndKeepsTheConnection: a message amqp091
// cannot encode (a 300-byte correlation id, from a raw-SQL outbox row, say)
// used to make the client close the whole connection, failing every
// message of the batch as "unavailable", forever. Now it alone fails, as
// undeliverable, and the connection stays.
func TestUnencodableMessageFailsAloneAndKeepsTheConnection(t *testing.T) {
	pl := newPlain(t)
	queue := uniq("unencodable")
	pl.cleanupQueues(queue)
	cfg := &Config{}
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: queue})
	tr := startTransport(t, cfg)
	before := currentConnForTest(t, tr)

	long := strings.Repeat("c", 300)
	for _, bad := range []*outbox.Message{
		{MessageID: "bad-corr", Destination: "queue:" + queue, CorrelationID: long},
		{MessageID: "bad-type", Destination: "queue:" + queue, MessageType: long},
		{MessageID: "bad-key", Destination: "queue:" + queue, Headers: map[string]string{long: "v"}},
		{MessageID: "bad-corr-header", Destination: "queue:" + queue, Headers: map[string]string{"correlation-id": long}},
		{MessageID: "bad-headers", Destination: "queue:" + queue, Headers: map[string]string{"big": strings.Repeat("v", 200_000)}},
		{MessageID: "bad-queue", Destination: "queue:" + long},
	} {
		errs := tr.Deliver(context.Background(), []*outbox.Message{
			{MessageID: "good-1-" + bad.MessageID, Destination: "queue:" + queue},
			bad,
			{MessageID: "good-2-" + bad.MessageID, Destination: "queue:" + queue},
		})
		if errs[0] != nil || errs[2] != nil {
			t.Errorf("%s: neighbours failed: %v; %v", bad.MessageID, errs[0], errs[2])
		}
		if !errors.Is(errs[1], outbox.ErrUndeliverable) || errors.Is(errs[1], outbox.ErrTransportUnavailable) {
			t.Errorf("%s: %v; want ErrUndeliverable, not unavailable", bad.MessageID, errs[1])
		}
		t.Logf("%s: %v", bad.MessageID, errs[1])
	}
	if after := currentConnForTest(t, tr); after != before {
		t.Error("the transport reconnected: the bad message closed the connection")
	}
	if got := pl.count(queue); got != 12 {
		t.Errorf("queue holds %d messages; want the 12 good ones", got)
	}
}

// restrictedUser creates a RabbitMQ user that may do anything on vhost /
// except publish to exchanges whose names start with forbidden, and returns
// its broker URL. The user is deleted at cleanup.
func restrictedUser(t *testing.T, forbidden string) string {
	t.Helper()
	u, err := url.Parse(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	name := uniq("user")
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("add_user", name, "pw-"+name)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", name).Run() })
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	run("set_permissions", "-p", vhost, name, ".*", fmt.Sprintf("^(?!%s).*", strings.ReplaceAll(forbidden, ".", `\.`)), ".*")
	u.User = url.UserPassword(name, "pw-"+name)
	return u.String()
}

// TestBrokerRefusalChargesOnlyTheRefusedMessage: the broker closes the
// shared publish channel (ACCESS_REFUSED) over one message of a batch; it
// used to charge a failed attempt to every unconfirmed message of the batch.
// Now the refused one alone fails; its neighbours are confirmed.
func TestBrokerRefusalChargesOnlyTheRefusedMessage(t *testing.T) {
	pl := newPlain(t)
	queue := uniq("refusal")
	forbidden := uniq("forbidden")
	pl.cleanupQueues(queue)
	pl.cleanupExchanges(forbidden)
	if err := pl.ch().ExchangeDeclare(forbidden, "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cfg := &Config{ReconnectMaxInterval: 1e9, ConnectTimeout: 10e9}
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: queue})
	tr, err := open(restrictedUser(t, forbidden), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	if err := tr.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	before := currentConnForTest(t, tr)

	var msgs []*outbox.Message
	for i := 0; i < 50; i++ {
		msgs = append(msgs, &outbox.Message{MessageID: fmt.Sprintf("good-%d", i), Destination: "queue:" + queue})
		if i == 10 || i == 30 {
			msgs = append(msgs, &outbox.Message{MessageID: fmt.Sprintf("refused-%d", i), Destination: "exchange:" + forbidden})
		}
		if i == 30 { // two refused in a row: the second must not be judged on the first's closing channel
			msgs = append(msgs, &outbox.Message{MessageID: "refused-31", Destination: "exchange:" + forbidden})
		}
	}
	errs := tr.Deliver(context.Background(), msgs)
	charged := 0
	for i, m := range msgs {
		refused := strings.HasPrefix(m.MessageID, "refused")
		switch {
		case refused && (errs[i] == nil || errors.Is(errs[i], outbox.ErrTransportUnavailable)):
			t.Errorf("%s: %v; want a counted error", m.MessageID, errs[i])
		case refused:
			if !strings.Contains(errs[i].Error(), "ACCESS_REFUSED") || !strings.Contains(errs[i].Error(), m.MessageID) {
				t.Errorf("%s: error does not name the message and the reason: %v", m.MessageID, errs[i])
			}
			t.Logf("%s: %v", m.MessageID, errs[i])
		case errs[i] != nil:
			charged++
			t.Errorf("%s, a neighbour, failed: %v", m.MessageID, errs[i])
		}
	}
	if charged > 0 {
		t.Errorf("%d good messages were charged with the refusal", charged)
	}
	if after := currentConnForTest(t, tr); after != before {
		t.Error("the transport reconnected over a channel refusal")
	}
	if got := pl.count(queue); got < 50 {
		t.Errorf("queue holds %d messages; want the 50 good ones (duplicates allowed)", got)
	}
}
