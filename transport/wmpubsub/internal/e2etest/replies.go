package e2etest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
)

// requestNoConsumer: a request to a queue no endpoint declared fails with
// bus.ErrNoConsumer at once (the preset's QueueExists), not at the
// request's timeout, and writes no topic for it.
func requestNoConsumer(t *testing.T, c Config) {
	e := newEnv(t, c)
	typ := e.name("Ping")
	b := e.start(false, nil, []string{typ}, func(*endpoint.Endpoints) {})
	nobody := e.name("nobody-consumes")
	start := time.Now()
	_, err := bus.Request[Pong](context.Background(), b, nobody, Ping{N: 1},
		bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ}), bus.WithRequestTimeout(30*time.Second))
	if !errors.Is(err, bus.ErrNoConsumer) {
		t.Fatalf("Request to %q: %v, want an error wrapping bus.ErrNoConsumer", nobody, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Request failed after %v, want at once (the timeout is 30s)", d)
	}
	if c.QueueTopicExists(t, nobody) {
		t.Errorf("the request created a topic for %q", nobody)
	}
}

// replyTopicRemoved: the reply queue a request declared is gone from the
// Pub/Sub once its bus stopped.
func replyTopicRemoved(t *testing.T, c Config) {
	e := newEnv(t, c)
	ep, typ := e.name("rr-stop"), e.name("Ping")
	b := e.start(false, []string{ep}, []string{typ}, doubler(ep, typ, double))
	if _, err := bus.Request[Pong](context.Background(), b, ep, Ping{N: 1},
		bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ}), bus.WithRequestTimeout(20*time.Second)); err != nil {
		t.Fatalf("Request: %v", err)
	}
	e.mu.Lock()
	replies := append([]string(nil), e.replies...)
	e.mu.Unlock()
	if len(replies) != 1 {
		t.Fatalf("reply queues declared: %q, want one", replies)
	}
	if !c.QueueTopicExists(t, replies[0]) {
		t.Fatalf("reply queue %q has no topic while its bus runs", replies[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if c.QueueTopicExists(t, replies[0]) {
		t.Errorf("reply queue %q still has its topic after Stop", replies[0])
	}
}
