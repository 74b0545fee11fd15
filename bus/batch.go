package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/detach"
)

// Group commit (endpoint.Batch). An endpoint that group-commits holds
// BatchDeliveriesPerHandler deliveries per ConcurrentMessageLimit slot
// (one router handler each) and runs ConcurrentMessageLimit workers. A
// handler hands its delivery's attempt to the workers and waits for its
// result; a free worker takes every attempt already waiting (up to
// MaxMessages; it never waits for more, so at low load a batch is one
// message) and runs them through the inbox's batch methods: one statement
// locks them all, one transaction runs each in its own savepoint and marks
// the ones that succeeded. What the batch cannot settle (an entry locked by
// another delivery, an id twice in one batch) goes back to the handler,
// which runs that attempt alone, as without group commit; so do retries'
// backoffs, redeliveries and dead letters, which stay per message. A batch
// of one (every batch at low load) runs the per-message path in the
// worker, adding no statement to it.

// batchJob is one attempt of one delivery, handed to the workers.
type batchJob struct {
	ctx   context.Context // the attempt's
	id    string
	run   func(context.Context) error
	state *deliveryState
	alone func() error // the attempt by itself (a batch of one runs it)

	// Set by the worker before done is closed.
	err      error
	fallback bool // not settled by the batch: the handler runs it alone
	done     chan struct{}
}

type batcher struct {
	b       *Bus
	ep      *endpoint.Endpoint
	store   inbox.BatchStore
	log     *slog.Logger
	timeout time.Duration // InboxLockTimeout
	jobs    chan *batchJob
	stop    <-chan struct{} // closed when the workers stop
}

// batching reports whether ep group-commits on this bus.
func (b *Bus) batching(ep *endpoint.Endpoint) bool {
	_, ok := b.inboxSt.(inbox.BatchStore)
	return ok && ep.BatchEnabled()
}

// handlersFor is how many router handlers (deliveries in hand) ep gets.
func (b *Bus) handlersFor(ep *endpoint.Endpoint) int {
	if b.batching(ep) {
		return ep.ConcurrentMessageLimit * endpoint.BatchDeliveriesPerHandler
	}
	return ep.ConcurrentMessageLimit
}

// startBatchers starts the workers of every endpoint that group-commits;
// they stop when ctx ends, after the batch in hand.
func (b *Bus) startBatchers(ctx context.Context) {
	b.batchers = map[string]*batcher{}
	for _, ep := range b.endpoints {
		if !b.batching(ep) {
			continue
		}
		stop := make(chan struct{})
		bt := &batcher{
			b: b, ep: ep, store: b.inboxSt.(inbox.BatchStore), log: b.log.With("endpoint", ep.Name()),
			timeout: b.cfg.outboxOpts.InboxLockTimeout, jobs: make(chan *batchJob, b.handlersFor(ep)), stop: stop,
		}
		b.batchers[ep.Name()] = bt
		done := make(chan struct{}, ep.ConcurrentMessageLimit)
		for range ep.ConcurrentMessageLimit {
			go func() {
				defer func() { done <- struct{}{} }()
				bt.work(ctx)
			}()
		}
		go func() {
			for range ep.ConcurrentMessageLimit {
				<-done
			}
			close(stop)
		}()
	}
}

// submit hands an attempt to the workers and waits for its result:
// fallback when the batch left it to the caller.
func (bt *batcher) submit(ctx context.Context, id string, run func(context.Context) error, state *deliveryState, alone func() error) (fallback bool, err error) {
	j := &batchJob{ctx: ctx, id: id, run: run, state: state, alone: alone, done: make(chan struct{})}
	// The queue holds one job per handler: the send never blocks.
	select {
	case bt.jobs <- j:
	case <-bt.stop:
		return false, errHandBack
	}
	if h := bt.b.submitHook; h != nil {
		h(id)
	}
	select {
	case <-j.done:
	case <-bt.stop:
		// Every worker has returned, so a job taken by one is done; one
		// still queued never will be.
		if !isClosed(j.done) {
			return false, errHandBack
		}
	}
	return j.fallback, j.err
}

func (bt *batcher) work(ctx context.Context) {
	max := bt.ep.Batch.MaxMessages
	batch := make([]*batchJob, 0, max)
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-bt.jobs:
			batch = append(batch[:0], j)
		}
	fill:
		for len(batch) < max {
			select {
			case j := <-bt.jobs:
				batch = append(batch, j)
			default:
				break fill
			}
		}
		bt.process(ctx, batch)
	}
}

// process settles a batch; every job's done is closed when it returns.
func (bt *batcher) process(ctx context.Context, batch []*batchJob) {
	defer func() {
		if v := recover(); v != nil {
			// The framework's bug, not a consumer's (callConsumer recovers
			// those): every job not settled fails with it.
			perr := &PanicError{Value: v, Stack: string(debug.Stack())}
			bt.log.Error("group commit panicked; the batch's messages are retried", "error", perr)
			for _, j := range batch {
				if !isClosed(j.done) {
					j.err = perr
					close(j.done)
				}
			}
		}
	}()
	if h := bt.b.batchHook; h != nil {
		ids := make([]string, len(batch))
		for i, j := range batch {
			ids[i] = j.id
		}
		h(bt.ep.Name(), ids)
	}
	// Once Stop has begun no message starts: the ones in hand go back to
	// the broker, as a prefetched message does.
	if isClosed(bt.b.gate.stopping()) {
		for _, j := range batch {
			j.err = errHandBack
			close(j.done)
		}
		return
	}
	// Only the first attempt of an id can be locked by this batch; a
	// repeat waits for it alone, as a concurrent delivery would.
	var lockable []*batchJob
	seen := make(map[string]bool, len(batch))
	for _, j := range batch {
		switch {
		case j.ctx.Err() != nil:
			j.err = j.ctx.Err()
			close(j.done)
		case seen[j.id]:
			j.fallback = true
			close(j.done)
		default:
			seen[j.id] = true
			lockable = append(lockable, j)
		}
	}
	switch len(lockable) {
	case 0:
		return
	case 1:
		// A batch of one (low load) takes the per-message path: the same
		// lock, a transaction without fence or savepoint, the same
		// statements as with group commit off.
		j := lockable[0]
		j.err = j.alone()
		bt.b.obs.batched(bt.ep.Name(), 1)
		close(j.done)
		return
	}
	ids := make([]string, len(lockable))
	for i, j := range lockable {
		ids[i] = j.id
	}
	locks, err := bt.store.TryLockBatch(ctx, bt.ep.Name(), ids, bt.timeout)
	if err != nil {
		err = bt.storeErr(ctx, "lock batch", err)
		for _, j := range lockable {
			j.err = err
			close(j.done)
		}
		return
	}
	var jobs []*batchJob
	var items []inbox.BatchItem
	for i, j := range lockable {
		switch locks[i].State {
		case inbox.Acquired:
			jobs = append(jobs, j)
			items = append(items, inbox.BatchItem{MessageID: j.id, Token: locks[i].Token, Ctx: j.ctx, Timeout: bt.ep.HandlerTimeout, Fn: j.run})
		case inbox.Processed:
			bt.log.DebugContext(j.ctx, "inbox: duplicate skipped", "message_id", j.id, "consumer_type", bt.ep.Name())
			j.state.duplicate.Store(true)
			close(j.done)
		default:
			j.fallback = true
			close(j.done)
		}
	}
	// Batches bounded in time: what did not start goes in the next one,
	// still locked.
	for len(items) > 0 {
		if isClosed(bt.b.gate.stopping()) {
			// What did not start goes back, its lock released so that
			// the redelivery need not wait for it to expire.
			for i, j := range jobs {
				key := inbox.Key{MessageID: items[i].MessageID, ConsumerType: bt.ep.Name()}
				rctx, cancel := detach.From(ctx)
				err := bt.b.inboxSt.Release(rctx, key, items[i].Token)
				cancel()
				if err != nil && !errors.Is(err, inbox.ErrLockLost) {
					bt.log.WarnContext(j.ctx, "inbox: releasing lock failed; it will expire", "message_id", key.MessageID, "error", err)
				}
				j.err = errHandBack
				close(j.done)
			}
			return
		}
		errs := bt.store.ProcessBatch(ctx, bt.ep.Name(), items, time.Now().Add(bt.ep.Batch.MaxDuration))
		// The ones not started go in the next transaction and count there.
		bt.b.obs.batched(bt.ep.Name(), len(items)-countNotStarted(errs))
		// A statement of the batch's own failed (a StoreError): its
		// transaction, and the release of its locks with it, may have
		// failed with the database. Otherwise the failed items' locks
		// were released with the commit.
		failedTx := slices.ContainsFunc(errs, func(err error) bool {
			var se *inbox.StoreError
			return errors.As(err, &se)
		})
		var nextJobs []*batchJob
		var nextItems []inbox.BatchItem
		for i, j := range jobs {
			if errors.Is(errs[i], inbox.ErrNotStarted) {
				nextJobs, nextItems = append(nextJobs, j), append(nextItems, items[i])
				continue
			}
			j.err = errs[i]
			if failedTx && j.err != nil && !errors.Is(j.err, inbox.ErrLockLost) {
				// The delivery's next attempt releases this lock first
				// (a no-op when the release did not fail).
				keepLock(j.ctx, items[i].Token)
			}
			var se *inbox.StoreError
			if errors.As(j.err, &se) {
				j.err = bt.storeErr(ctx, se.Op, se.Err)
			}
			close(j.done)
		}
		jobs, items = nextJobs, nextItems
	}
}

// storeErr is the error of a batch statement: the workers stopping (the
// bus is stopping) hands the message back; any other failure is the
// inbox's, classified as such by consume.
func (bt *batcher) storeErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", errHandBack, err)
	}
	return &inbox.StoreError{Op: op, Err: err}
}

func countNotStarted(errs []error) int {
	n := 0
	for _, err := range errs {
		if errors.Is(err, inbox.ErrNotStarted) {
			n++
		}
	}
	return n
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
