package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
)

// TestNackAmongAcksIsNeverReadAsAck mixes, on one confirm channel,
// publishes to a full queue (overflow reject-publish: the broker nacks them
// at once) with persistent publishes to a healthy durable queue (acked after
// fsync, so the acks come after the nacks, as one multiple ack). amqp091's
// NotifyPublish merges such a nack into the later multiple ack; a transport
// that read confirms there reported rejected messages delivered (issue 31:
// 40 of 80 in a plain amqp091 program). Over many rounds: every message to
// the full queue fails as a nack of its own (an attempt of its row, never
// success, never "transport unavailable"), and every healthy message is
// confirmed, never charged because of a neighbour's nack.
func TestNackAmongAcksIsNeverReadAsAck(t *testing.T) {
	pl := newPlain(t)
	healthy, full := uniq("confirm-ok"), uniq("confirm-full")
	pl.cleanupQueues(healthy, full)
	cfg := &Config{}
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: healthy})
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: full, MaxLength: 1, Overflow: "reject-publish"})
	tr := startTransport(t, cfg)
	ctx := context.Background()
	if err := tr.Deliver(ctx, []*outbox.Message{{MessageID: "fill", Destination: "queue:" + full}})[0]; err != nil {
		t.Fatal(err)
	}

	const rounds, perRound = 20, 60
	var rejected, delivered int
	for r := range rounds {
		msgs := make([]*outbox.Message, perRound)
		for i := range msgs {
			dest := healthy
			if i%4 == 1 {
				dest = full
			}
			msgs[i] = &outbox.Message{MessageID: fmt.Sprintf("r%d-%d-%s", r, i, dest[len(dest)-8:]),
				Destination: "queue:" + dest, Payload: []byte("payload")}
		}
		for i, err := range tr.Deliver(outbox.WithRetryAfter(ctx), msgs) {
			toFull := i%4 == 1
			var ne *nackedError
			switch {
			case toFull && err == nil:
				t.Errorf("round %d: message %s to the full queue reported delivered: the broker nacked it", r, msgs[i].MessageID)
			case toFull && (!errors.As(err, &ne) || ne.ackAfterNack || errors.Is(err, outbox.ErrTransportUnavailable)):
				t.Errorf("round %d: message %s to the full queue: %v, want the broker's nack, charged to its row", r, msgs[i].MessageID, err)
			case toFull:
				rejected++
			case err != nil:
				t.Errorf("round %d: healthy message %s: %v, want it confirmed (not charged for a neighbour's nack)", r, msgs[i].MessageID, err)
			default:
				delivered++
			}
		}
	}
	if got := pl.count(full); got != 1 {
		t.Errorf("the full queue holds %d messages, want 1", got)
	}
	if got := pl.count(healthy); got != delivered {
		t.Errorf("the healthy queue holds %d messages, want the %d confirmed", got, delivered)
	}
	t.Logf("%d rejected, %d delivered", rejected, delivered)
}

// TestSilentDestinationIsChargedNotTheTransport (issue 33, item 4): a
// queue whose process stopped answering (suspended: it never confirms)
// beside a healthy queue. A publish to it used to time out as "transport
// unavailable", so the relay released its row uncounted, first in the
// claim order, never parked, and every batch that took it waited
// PublishTimeout while the worker backed off. The broker answers, so the
// timeout is the destination's: charged to that message (an attempt of its
// row), whether or not later publishes on the channel were confirmed; the
// healthy messages are confirmed.
func TestSilentDestinationIsChargedNotTheTransport(t *testing.T) {
	pl := newPlain(t)
	healthy, silent := uniq("silent-ok"), uniq("silent")
	pl.cleanupQueues(healthy, silent)
	// Few publish slots: silent publishes must not keep them (the channel
	// is retired when a confirm does not come, which settles them).
	cfg := &Config{PublishTimeout: 500 * time.Millisecond, MaxPendingPublishes: 4}
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: healthy})
	cfg.Topology.DeclareQueue(endpoint.Queue{Name: silent})
	tr := startTransport(t, cfg)
	testenv.SuspendRabbitQueue(t, silent)
	ctx := context.Background()
	for _, batch := range [][]string{{silent, healthy, healthy, silent, healthy}, {silent}, {silent, silent, silent}, {silent, silent, silent}, {healthy, healthy, healthy, healthy, healthy}} {
		msgs := make([]*outbox.Message, len(batch))
		for i, q := range batch {
			msgs[i] = &outbox.Message{MessageID: fmt.Sprintf("%s-%d-%d", q[len(q)-8:], len(batch), i), Destination: "queue:" + q, Payload: []byte("x")}
		}
		began := time.Now()
		errs := tr.Deliver(outbox.WithRetryAfter(ctx), msgs)
		took := time.Since(began)
		for i, err := range errs {
			switch {
			case batch[i] == healthy && err != nil:
				t.Errorf("healthy message %s: %v", msgs[i].MessageID, err)
			case batch[i] == silent && err == nil:
				t.Errorf("message %s to the silent queue reported confirmed", msgs[i].MessageID)
			case batch[i] == silent && errors.Is(err, outbox.ErrTransportUnavailable):
				t.Errorf("message %s to the silent queue: %v; want it charged to the message, not the transport", msgs[i].MessageID, err)
			}
		}
		if took > 5*time.Second {
			t.Errorf("a batch of %d took %v with a 500ms PublishTimeout", len(batch), took)
		}
		t.Logf("batch of %d: %v after %v", len(batch), errs, took.Round(time.Millisecond))
	}
}
