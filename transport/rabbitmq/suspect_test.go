package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// suspectSetup starts a transport with a suspect window on the single
// broker, a queue to publish to and a full queue whose publishes are nacked
// (a failure signal).
func suspectSetup(t *testing.T, window time.Duration) (tr *Transport, pl *plain, queue, full string) {
	t.Helper()
	pl = newPlain(t)
	queue, full = uniq("suspect"), uniq("suspect-full")
	pl.cleanupQueues(queue, full)
	cfg := &Config{SuspectWindow: window}
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: queue})
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: full, MaxLength: 1, Overflow: "reject-publish"})
	tr = startTransport(t, cfg)
	return tr, pl, queue, full
}

func suspectMsgs(queue string, n int) []*outbox.Message {
	msgs := make([]*outbox.Message, n)
	for i := range msgs {
		msgs[i] = &outbox.Message{MessageID: fmt.Sprintf("%s-%d", queue, i), Destination: "queue:" + queue, Payload: []byte("x")}
	}
	return msgs
}

// nackOnce fills the full queue and gets one nack: a failure signal.
func nackOnce(t *testing.T, tr *Transport, full string) {
	t.Helper()
	ctx := context.Background()
	if err := tr.Deliver(ctx, []*outbox.Message{{MessageID: "fits", Destination: "queue:" + full}})[0]; err != nil {
		t.Fatal(err)
	}
	var ne *nackedError
	if err := tr.Deliver(ctx, []*outbox.Message{{MessageID: "full", Destination: "queue:" + full}})[0]; !errors.As(err, &ne) {
		t.Fatalf("publish to the full queue = %v, want a nack", err)
	}
}

// copies drains queue and counts the copies of each message id.
func copies(t *testing.T, pl *plain, queue string) map[string]int {
	t.Helper()
	got := map[string]int{}
	ch := pl.ch()
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return got
		}
		got[d.MessageId]++
	}
}

func wantCopies(t *testing.T, got map[string]int, msgs []*outbox.Message, want int) {
	t.Helper()
	if len(got) != len(msgs) {
		t.Errorf("queue holds %d distinct messages, want %d", len(got), len(msgs))
	}
	for _, m := range msgs {
		if got[m.MessageID] != want {
			t.Errorf("message %s: %d copies in the queue, want %d", m.MessageID, got[m.MessageID], want)
		}
	}
}

// TestSuspectWindowNoFailureChangesNothing: with a window configured but no
// failure signal, every message is sent once, confirmed at once (no wait
// for a window) and Deliver reports success, for the relay and direct.
func TestSuspectWindowNoFailureChangesNothing(t *testing.T) {
	const window = 3 * time.Second
	tr, pl, queue, _ := suspectSetup(t, window)
	msgs := suspectMsgs(queue, 50)
	start := time.Now()
	for i, err := range tr.Deliver(outbox.WithRetryAfter(context.Background()), msgs[:25]) {
		if err != nil {
			t.Fatalf("relay deliver %d: %v", i, err)
		}
	}
	for i, err := range tr.Deliver(context.Background(), msgs[25:]) {
		if err != nil {
			t.Fatalf("direct deliver %d: %v", i, err)
		}
	}
	if took := time.Since(start); took >= window {
		t.Errorf("50 publishes took %v, not less than the window %v: waited for a window without a failure", took, window)
	}
	if tr.lastSignal.Load() != 0 {
		t.Error("a failure signal was recorded without a failure")
	}
	wantCopies(t, copies(t, pl, queue), msgs, 1)
}

// TestSuspectWindowAfterNackHoldsOnlyItsDestination (issue 33, item 3):
// a nack is a failure signal for its destination only. After the full
// queue nacks, messages to another queue are trusted at once (one send
// each, no wait) however often the full one nacks; an ack from the full
// queue itself within the window is not trusted: the relay's Deliver
// returns *outbox.RetryAfterError with the time left, and after the window
// it is trusted.
func TestSuspectWindowAfterNackHoldsOnlyItsDestination(t *testing.T) {
	const window = 1500 * time.Millisecond
	tr, pl, queue, full := suspectSetup(t, window)
	nackOnce(t, tr, full)
	ctx := outbox.WithRetryAfter(context.Background())
	msgs := suspectMsgs(queue, 20)
	for round := range 4 {
		var ne *nackedError
		if err := tr.Deliver(ctx, []*outbox.Message{{MessageID: fmt.Sprint("full-again-", round), Destination: "queue:" + full}})[0]; !errors.As(err, &ne) {
			t.Fatalf("publish to the full queue = %v, want a nack", err)
		}
		for i, err := range tr.Deliver(ctx, msgs[round*5:round*5+5]) {
			if err != nil {
				t.Fatalf("round %d: message %d to another queue after the full queue's nack: %v, want it trusted", round, i, err)
			}
		}
	}
	wantCopies(t, copies(t, pl, queue), msgs, 1)

	if _, err := pl.ch().QueuePurge(full, false); err != nil {
		t.Fatal(err)
	}
	room := []*outbox.Message{{MessageID: "room", Destination: "queue:" + full}}
	var ra *outbox.RetryAfterError
	err := tr.Deliver(ctx, room)[0]
	if !errors.As(err, &ra) || ra.After <= 0 || ra.After > window {
		t.Fatalf("an ack from the queue that nacked, within the window = %v, want a *outbox.RetryAfterError with the time left", err)
	}
	time.Sleep(ra.After) // the relay's row is claimable again after this (Store.Release)
	if _, err := pl.ch().QueuePurge(full, false); err != nil {
		t.Fatal(err)
	}
	if err := tr.Deliver(ctx, room)[0]; err != nil {
		t.Fatalf("the same message after the window: %v", err)
	}
}

// TestSuspectWindowDirectDeliverWaits: a Deliver whose caller does not
// handle *outbox.RetryAfterError (Publish without the outbox, a reply)
// waits for the window to end, sends the suspect messages again and
// returns success; each message is in the queue twice.
func TestSuspectWindowDirectDeliverWaits(t *testing.T) {
	const window = 1500 * time.Millisecond
	tr, pl, queue, _ := suspectSetup(t, window)
	tr.suspect("test: a failure signal of the connection")
	signal := tr.epoch.Add(time.Duration(tr.lastSignal.Load() - 1))
	msgs := suspectMsgs(queue, 20)
	for i, err := range tr.Deliver(context.Background(), msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if end := signal.Add(window); time.Now().Before(end) {
		t.Errorf("Deliver returned %v before the window ended", time.Until(end))
	}
	wantCopies(t, copies(t, pl, queue), msgs, 2)

	// A caller's context that ends during the wait gets an error that
	// wraps ErrTransportUnavailable, not a success.
	tr.suspect("test: another failure signal")
	more := []*outbox.Message{{MessageID: "short", Destination: "queue:" + queue}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := tr.Deliver(ctx, more)[0]; !errors.Is(err, outbox.ErrTransportUnavailable) || !strings.Contains(err.Error(), "gave up") {
		t.Errorf("Deliver with a context shorter than the window = %v, want an unavailable error", err)
	}
}

// TestSuspectWindowAfterReconnect: a connection the broker closes is a
// failure signal; publishes after the reconnect, within the window, are
// sent again once it has passed.
func TestSuspectWindowAfterReconnect(t *testing.T) {
	const window = 1500 * time.Millisecond
	tr, pl, queue, _ := suspectSetup(t, window)
	if tr.lastSignal.Load() != 0 {
		t.Fatal("a single broker's start must not be a failure signal")
	}
	before := tr.connects.Load()
	closeConnection(t, tr)
	deadline := time.Now().Add(20 * time.Second)
	for tr.connects.Load() == before || tr.Health(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("not reconnected within 20 s")
		}
		time.Sleep(20 * time.Millisecond) // no reconnect notification to wait on
	}
	msgs := suspectMsgs(queue, 10)
	ctx := outbox.WithRetryAfter(context.Background())
	var after time.Duration
	for i, err := range tr.Deliver(ctx, msgs) {
		var ra *outbox.RetryAfterError
		if !errors.As(err, &ra) {
			t.Fatalf("message %d after the reconnect: %v, want a *outbox.RetryAfterError", i, err)
		}
		after = max(after, ra.After)
	}
	time.Sleep(after)
	for i, err := range tr.Deliver(ctx, msgs) {
		if err != nil {
			t.Fatalf("message %d after the window: %v", i, err)
		}
	}
	wantCopies(t, copies(t, pl, queue), msgs, 2)
}

// TestSuspectWindowDirectDeliverGivesUp: while failure signals keep coming
// (one every few milliseconds, each opening a new window), a direct Deliver
// sends the message once and again after each of maxSuspectRounds windows,
// then gives up with an unavailable error in bounded time rather than
// waiting for ever; once the signals stop, Deliver succeeds at once.
func TestSuspectWindowDirectDeliverGivesUp(t *testing.T) {
	const window = 150 * time.Millisecond
	tr, pl, queue, _ := suspectSetup(t, window)
	stop := make(chan struct{})
	stopped := make(chan struct{})
	tr.suspect("test: the first signal")
	go func() {
		defer close(stopped)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				tr.suspect("test: a signal")
			}
		}
	}()
	msgs := suspectMsgs(queue, 3)
	start := time.Now()
	errs := tr.Deliver(context.Background(), msgs)
	took := time.Since(start)
	close(stop)
	<-stopped
	for i, err := range errs {
		if !errors.Is(err, outbox.ErrTransportUnavailable) || !strings.Contains(err.Error(), "not trusted") {
			t.Errorf("message %d under endless signals: %v, want an unavailable error saying its confirms were not trusted", i, err)
		}
	}
	// maxSuspectRounds waits of about a window each, plus the sends.
	if limit := time.Duration(maxSuspectRounds+1)*window + 5*time.Second; took > limit {
		t.Errorf("Deliver gave up after %v, want within %v", took, limit)
	}
	if took < time.Duration(maxSuspectRounds)*window {
		t.Errorf("Deliver gave up after %v, before %d windows of %v", took, maxSuspectRounds, window)
	}
	wantCopies(t, copies(t, pl, queue), msgs, maxSuspectRounds+1)

	// The signals have stopped: once the last window has passed, the
	// next messages go through with one send each.
	time.Sleep(window) // the last signal's window; the transport has no event for its end
	more := suspectMsgs(queue+"-after", 2)
	for i := range more {
		more[i].Destination = "queue:" + queue
	}
	for i, err := range tr.Deliver(context.Background(), more) {
		if err != nil {
			t.Fatalf("message %d after the signals stopped: %v", i, err)
		}
	}
	wantCopies(t, copies(t, pl, queue), more, 1)
}

func TestSuspectWindowConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  string
		set  time.Duration
		want time.Duration
	}{
		{"one broker: off", "amqp://a/", 0, 0},
		{"one broker, set", "amqp://a/", time.Second, time.Second},
		{"cluster: off", "amqp://a/,amqp://b/", 0, 0},
		{"cluster, set", "amqp://a/,amqp://b/", 2 * time.Second, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := open(tc.url, &Config{SuspectWindow: tc.set}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tr.cfg.SuspectWindow != tc.want {
				t.Errorf("SuspectWindow = %v, want %v", tr.cfg.SuspectWindow, tc.want)
			}
		})
	}
	_, err := open("amqp://a/", &Config{SuspectWindow: -time.Second}, nil)
	if err == nil || !strings.Contains(err.Error(), "SuspectWindow") {
		t.Errorf("a negative SuspectWindow = %v, want an error naming it", err)
	}
}
