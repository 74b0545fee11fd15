package e2etest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
)

// departed: a consumer of the endpoint's group read two entries and went
// away without acknowledging them: a new message, and a second copy of it
// (the same UUID, as a publisher retrying would send). The bus, started
// after, must claim both once they have been idle past its redelivery
// timeout: one effect, the copy absorbed by the inbox as a duplicate,
// nothing left to claim again (no loop), and a neighbour published
// meanwhile processed too.
func departed(t *testing.T, c Config) {
	e := newEnv(t, c)
	typ := e.name("OrderPlaced")
	ep := e.name("rebalance")
	body, _ := json.Marshal(Order{N: 1})
	orphan := e.name("orphaned")
	first := message.NewMessage(orphan, body)
	first.Metadata.Set(bus.HeaderMessageType, typ)
	copyOf := message.NewMessage(orphan, body)
	copyOf.Metadata.Set(bus.HeaderMessageType, typ)
	c.Orphan(t, c.TypeTopic(typ), ep, first, copyOf)

	b := e.start(true, []string{ep}, []string{typ}, func(d *endpoint.Endpoints) {
		d.ReceiveEndpoint(ep, func(x *endpoint.Endpoint) {
			endpoint.Consumer(x, record(ep), endpoint.AsMessageType(typ))
		})
	})
	neighbour := e.name("neighbour")
	if err := b.Publish(context.Background(), Order{N: 2}, bus.Headers{bus.HeaderMessageID: neighbour, bus.HeaderMessageType: typ}); err != nil {
		t.Fatal(err)
	}
	e.waitEffects([][2]string{{ep, orphan}, {ep, neighbour}}, 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for e.outcome(ep, bus.OutcomeDuplicate) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the departed consumer's second pending copy never reached the inbox: %v", e.outcomes())
		}
		select {
		case <-e.events:
		case <-time.After(200 * time.Millisecond):
		}
	}
	// A claimed entry that was not acknowledged would be claimed again
	// after the redelivery timeout (1-2s): no event says that nothing
	// happens, so watch for 3s, longer than one.
	time.Sleep(3 * time.Second)
	got := e.effects()
	if got[[2]string{ep, orphan}] != 1 || got[[2]string{ep, neighbour}] != 1 {
		t.Errorf("effects %v, want one each", got)
	}
	if n := e.outcome(ep, bus.OutcomeDuplicate); n != 1 {
		t.Errorf("%d duplicates, want 1 (the copy, once: more is a claim loop); outcomes %v", n, e.outcomes())
	}
	if n := e.outcome(ep, bus.OutcomeCommitted); n != 2 {
		t.Errorf("%d committed, want 2; outcomes %v", n, e.outcomes())
	}
}
