package transport

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Subscriptions is the bookkeeping a transport's message.Subscriber needs
// around its consumers: one goroutine per Subscribe call, stopped when the
// caller's context ends, when the subscriber is closed or when the
// transport's context (the parent) is canceled, with the output channel
// closed once the consumer has returned. Close waits for every consumer
// started through it.
type Subscriptions struct {
	name   string          // transport name for errors: "rabbitmq", "pgtransport"
	ctx    context.Context // canceled by Close or with the parent
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// NewSubscriptions returns the bookkeeping of one subscriber whose
// consumers stop when parent (the transport's lifetime) is canceled. name
// prefixes its errors.
func NewSubscriptions(parent context.Context, name string) *Subscriptions {
	ctx, cancel := context.WithCancel(parent)
	return &Subscriptions{name: name, ctx: ctx, cancel: cancel}
}

// Start starts one consumer of queue. admit is called first: it refuses
// (with an error) when the transport cannot take consumers, or returns the
// function to call once the consumer has finished (the transport's own
// wait group). run consumes into out until its context is done; out is
// closed after run returns.
func (s *Subscriptions) Start(ctx context.Context, queue string, admit func() (done func(), err error),
	run func(ctx context.Context, out chan<- *message.Message)) (<-chan *message.Message, error) {
	if queue == "" {
		return nil, errors.New(s.name + ": subscribe: empty queue name")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New(s.name + ": subscribe: subscriber is closed")
	}
	done, err := admit()
	if err != nil {
		return nil, err
	}
	s.wg.Add(1)
	sctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	out := make(chan *message.Message)
	go func() {
		defer s.wg.Done()
		defer done()
		defer close(out)
		defer stop()
		defer cancel()
		run(sctx, out)
	}()
	return out, nil
}

// Close stops every consumer started through s and waits for them to
// finish. It is idempotent.
func (s *Subscriptions) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}
