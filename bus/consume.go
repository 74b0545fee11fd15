package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/detach"
	"github.com/barewire-go/barewire/internal/plumb"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// ErrMissingMessageID is the dead-letter reason for a message without an id
// on an endpoint whose MissingMessageID policy is RejectMissingID.
var ErrMissingMessageID = errors.New("message has no id (no message_id property or message-id header); cannot deduplicate")

// maxInboundIDLen bounds the ids of received messages: an inbox key must fit
// a PostgreSQL index row (about 2.7 KB with the consumer type).
const maxInboundIDLen = 1024

type stateKey struct{}

// deliveryState travels in the consumer's context.
type deliveryState struct{ published, ran, ackedInTx, duplicate atomic.Bool }

func stateFrom(ctx context.Context) *deliveryState {
	s, _ := ctx.Value(stateKey{}).(*deliveryState)
	return s
}

// PanicError is a consumer panic turned into an error; its stack goes into
// the fault headers of the dead-lettered message.
type PanicError struct {
	Value any
	Stack string
}

func (p *PanicError) Error() string { return fmt.Sprintf("consumer panicked: %v", p.Value) }

type consumerPublisher struct{ b *Bus }

func (p consumerPublisher) Publish(ctx context.Context, msg any, h endpoint.Headers) error {
	return p.b.Publish(ctx, msg, h)
}

func (p consumerPublisher) Send(ctx context.Context, dest string, msg any, h endpoint.Headers) error {
	return p.b.Send(ctx, dest, msg, h)
}

type dispatcher struct {
	byType   map[string][]*endpoint.Registration
	catchAll *endpoint.Registration
}

func newDispatcher(ep *endpoint.Endpoint) *dispatcher {
	d := &dispatcher{byType: map[string][]*endpoint.Registration{}}
	for _, r := range ep.Consumers() {
		if r.MessageType == "" {
			d.catchAll = r
			continue
		}
		d.byType[r.MessageType] = append(d.byType[r.MessageType], r)
	}
	return d
}

func (d *dispatcher) lookup(typ string) []*endpoint.Registration {
	if rs := d.byType[typ]; len(rs) > 0 {
		return rs
	}
	if d.catchAll != nil {
		return []*endpoint.Registration{d.catchAll}
	}
	return nil
}

// handler builds the Watermill handler of one endpoint: retry policy around
// the inbox around the consumers, then dead-lettering. It reports the
// delivery to the bus's observers (observe.go) as it goes.
func (b *Bus) handler(ep *endpoint.Endpoint) message.NoPublishHandlerFunc {
	disp := newDispatcher(ep)
	log := b.log.With("endpoint", ep.Name())
	mw := &inbox.Middleware{
		Store: b.inboxSt, ConsumerType: ep.Name(), LockTimeout: b.cfg.outboxOpts.InboxLockTimeout,
		SingleTransaction: ep.Inbox == endpoint.InboxSingleTransaction, Logger: log,
		OnDuplicate: func(ctx context.Context, _ inbox.Key) {
			if st := stateFrom(ctx); st != nil {
				st.duplicate.Store(true)
			}
		},
		OnLockKept: func(ctx context.Context, _ inbox.Key, token string) { keepLock(ctx, token) },
		Stopping:   b.gate.stopping(),
		Settled:    &inbox.Settled{},
	}
	if b.cfg.clock != nil {
		mw.Clock = b.cfg.clock
	}
	return func(msg *message.Message) error {
		typ := msg.Metadata.Get(wire.HeaderMessageType)
		d := &delivery{msg: msg, endpoint: ep.Name(), messageType: typ, knownType: len(disp.byType[typ]) > 0, start: time.Now()}
		ctx := b.obs.started(context.WithValue(msg.Context(), deliveryKey{}, d), d)
		msg.SetContext(ctx)
		d.outcome = b.handle(ctx, ep, disp, mw, msg, log, d)
		b.obs.handled(ctx, d)
		if d.outcome == OutcomeRequeued {
			// Without an error, so the router logs none for what is an
			// expected outcome (we log it where it matters); its Ack after
			// a Nack is a no-op.
			msg.Nack()
		}
		return nil
	}
}

// handle runs a delivery to its outcome: consumed (or a duplicate), a
// delayed redelivery, a dead letter, or handed back to the broker.
func (b *Bus) handle(ctx context.Context, ep *endpoint.Endpoint, disp *dispatcher, mw *inbox.Middleware, msg *message.Message, log *slog.Logger, d *delivery) string {
	verdict, attempts, err := b.consume(ctx, ep, disp, mw, msg, log, d)
	switch {
	case err == nil:
		return verdict
	case errors.Is(err, errHandBack):
		// Shutting down (the wait for a busy entry or for the database
		// ends only then): the broker redelivers.
		return OutcomeRequeued
	}
	d.lastErr = err // also a failure before any attempt (an id that cannot be deduplicated)
	if n, ok := redeliveries(ep, msg, err); ok {
		if rErr := b.settle(ctx, log, "scheduling a redelivery", func(sctx context.Context) error {
			return b.redeliver(sctx, ep, msg, n, err)
		}); rErr != nil {
			return OutcomeRequeued
		}
		log.InfoContext(ctx, "message handed back for a delayed redelivery", "message_id", msg.UUID,
			"redelivery", n+1, "delay", ep.Redelivery[n], "error", err)
		return OutcomeRedelivery
	}
	dl := deadLetter(ep, msg, err, attempts)
	d.faultHeaders = maps.Clone(dl.Headers)
	form, dlErr := b.settleDeadLetter(ctx, ep, log, dl)
	if dlErr != nil {
		return OutcomeRequeued
	}
	d.deadLetterForm = form
	switch form {
	case deadLetterFull:
		log.WarnContext(ctx, "message dead-lettered", "message_id", quoteIfBad(msg.UUID), "message_type", d.messageType,
			"attempts", attempts, "error", err, "error_queue", ep.ErrorQueue)
	case deadLetterReduced:
		log.WarnContext(ctx, "message dead-lettered without its headers: the transport refused them", "message_id", quoteIfBad(msg.UUID),
			"message_type", d.messageType, "attempts", attempts, "error", err, "error_queue", ep.ErrorQueue)
	default:
		log.ErrorContext(ctx, "the transport refused the dead letter, even without its headers; written to the outbox, where the relay retries it and then parks it (OutboxStore lists it)",
			"message_id", quoteIfBad(msg.UUID), "message_type", d.messageType, "attempts", attempts, "error", err, "error_queue", ep.ErrorQueue)
	}
	b.answerFault(ctx, ep, msg, dl, log)
	return OutcomeDeadLettered
}

// maxOutagesPerDelivery bounds how often one delivery may close the
// database gate: a real outage closes it once for every delivery in hand
// (they wait at it), so a delivery that keeps meeting connection failures
// while probes succeed is charged with them instead.
const maxOutagesPerDelivery = 10

// errHandBack says the delivery ends without a verdict: the bus is stopping
// and the message goes back to the broker.
var errHandBack = errors.New("bus: stopping; message handed back to the broker")

// consume runs a delivery to a verdict: nil with OutcomeCommitted,
// OutcomeDuplicate or OutcomeAcked, the consumer's last failure (for
// redelivery or the dead letter), or errHandBack. It returns how many
// attempts ran. Failures are counted against the retry policy only when
// they are the consumer's (or this message's); a lock taken over by another
// delivery and a database outage are waited out uncounted, holding the
// message unacknowledged, so no requeue loop burns a quorum queue's
// delivery limit.
func (b *Bus) consume(ctx context.Context, ep *endpoint.Endpoint, disp *dispatcher, mw *inbox.Middleware, msg *message.Message, log *slog.Logger, d *delivery) (verdict string, attempts int, err error) {
	if err := checkInboundID(msg.UUID); err != nil {
		return "", 0, endpoint.Permanent(err)
	}
	tries := maxTries(ep.Retry)
	var bo backoff.BackOff // built at the first retry: most deliveries need none
	failures, outages := 0, 0
	for {
		if b.gate.wait(ctx) != nil {
			return "", attempts, errHandBack
		}
		attempts++
		d.attempt.Store(int64(attempts))
		verdict, err := "", b.releaseKeptLock(ctx, ep, msg, d)
		if err == nil {
			verdict, err = b.attempt(ctx, ep, disp, mw, msg, attempts, log)
		}
		kind, err := b.classify(ctx, err)
		switch kind {
		case outcomeOK:
			return verdict, attempts, nil
		case outcomeShutdown:
			return "", attempts, errHandBack
		case outcomeLockLost:
			// Another delivery took the entry over; the inbox will say
			// whether it committed (a duplicate then) or let it go.
			log.DebugContext(ctx, "inbox lock taken over by another delivery; looking again", "message_id", msg.UUID)
			continue
		case outcomeOutage:
			if outages++; outages <= maxOutagesPerDelivery {
				b.gate.down(ctx, err)
				continue
			}
			// The database keeps answering probes while this delivery keeps
			// failing on a connection: charge it, or it would loop forever.
			err = fmt.Errorf("%w (the %d-th database failure of this delivery while the database answered probes)", err, outages)
		}
		d.lastErr = err
		b.obs.attemptFailed(ctx, d)
		failures++
		if failures >= tries || endpoint.IsPermanent(err) || (ep.Retry.ShouldRetry != nil && !ep.Retry.ShouldRetry(err)) {
			return "", attempts, err
		}
		b.obs.retried(ctx, d)
		log.DebugContext(ctx, "consumer failed; retrying per policy", "message_id", msg.UUID, "attempt", attempts, "error", err)
		if bo == nil {
			bo = retryBackOff(ep.Retry)
			bo.Reset()
		}
		if d := bo.NextBackOff(); d > 0 {
			pause(ctx, d)
		}
	}
}

// settle runs a redelivery or dead letter until the transport confirms it,
// backing off while it fails (a broker outage), so that a failing transport
// causes no requeue loop. It gives up, for a requeue, only when the bus stops.
func (b *Bus) settle(ctx context.Context, log *slog.Logger, what string, fn func(context.Context) error) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = 10 * time.Second
	for n := 1; ; n++ {
		fctx, cancel := detach.From(ctx)
		err := fn(fctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-b.gate.stopping():
		default:
			d := bo.NextBackOff()
			log.WarnContext(ctx, what+" failed; trying again", "error", err, "try", n, "retry_in", d)
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
			case <-b.gate.stopping():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		log.WarnContext(ctx, what+" failed while stopping; message handed back to the broker", "error", err)
		return err
	}
}

// quoteIfBad shows an id that failed checkInboundID safely in logs.
func quoteIfBad(id string) string {
	if checkInboundID(id) != nil {
		return quoteID(id)
	}
	return id
}

// keepLock records, on the delivery of ctx, the token of an inbox lock
// that a failed attempt could not release.
func keepLock(ctx context.Context, token string) {
	if d, _ := ctx.Value(deliveryKey{}).(*delivery); d != nil {
		d.keptLock = token
	}
}

// releaseKeptLock releases the lock an earlier attempt of d kept, so that
// this attempt takes it at once after a database outage instead of waiting
// InboxLockTimeout for it to expire. A lock that has since expired, been
// taken over or processed (the failed commit had committed after all) is
// left as it is: the attempt then finds it so.
func (b *Bus) releaseKeptLock(ctx context.Context, ep *endpoint.Endpoint, msg *message.Message, d *delivery) error {
	if d.keptLock == "" {
		return nil
	}
	key := inbox.Key{MessageID: msg.UUID, ConsumerType: ep.Name()}
	if err := b.inboxSt.Release(ctx, key, d.keptLock); err != nil && !errors.Is(err, inbox.ErrLockLost) {
		return &inbox.StoreError{Op: "release the lock of a failed attempt", Err: err}
	}
	d.keptLock = ""
	return nil
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func maxTries(p endpoint.RetryPolicy) int {
	if p.Kind == endpoint.RetryNone {
		return 1
	}
	return p.Retries + 1
}

// ErrHandlerTimeout is the failure of a consumer that returned after its
// endpoint's HandlerTimeout: nothing it did commits, and the attempt counts
// as failed (retried per the endpoint's policy, then dead-lettered with
// this reason), whatever the consumer returned.
var ErrHandlerTimeout = errors.New("consumer returned after the endpoint's HandlerTimeout")

// overran reports whether the attempt's own deadline (HandlerTimeout)
// passed while the delivery's context is still live.
func overran(delivery, attempt context.Context) bool {
	return delivery.Err() == nil && errors.Is(attempt.Err(), context.DeadlineExceeded)
}

func handlerTimeout(d time.Duration, err error) error {
	if err == nil {
		return fmt.Errorf("%w (%v): it returned nil, too late; nothing it did was committed", ErrHandlerTimeout, d)
	}
	return fmt.Errorf("%w (%v): %w", ErrHandlerTimeout, d, err)
}

// attempt runs the consumers once, in a transaction, behind the inbox. On
// success it says whether they ran and committed (OutcomeCommitted) or the
// inbox skipped the message (OutcomeDuplicate).
func (b *Bus) attempt(ctx context.Context, ep *endpoint.Endpoint, disp *dispatcher, mw *inbox.Middleware, msg *message.Message, attempt int, log *slog.Logger) (string, error) {
	typ := msg.Metadata.Get(wire.HeaderMessageType)
	regs := disp.lookup(typ)
	if len(regs) == 0 {
		return "", endpoint.Permanent(fmt.Errorf("%w %q on endpoint %q (consumed types: %s)", endpoint.ErrUnknownMessageType, typ, ep.Name(), strings.Join(ep.MessageTypes(), ", ")))
	}
	headers := make(Headers, len(msg.Metadata))
	for k, v := range msg.Metadata {
		headers[k] = v
	}
	d := endpoint.NewDelivery(plumb.Token{}, endpoint.Delivery{
		MessageID:     msg.UUID,
		CorrelationID: msg.Metadata.Get(wire.HeaderCorrelationID),
		MessageType:   typ,
		ContentType:   msg.Metadata.Get(wire.HeaderContentType),
		Headers:       headers,
		Body:          msg.Payload,
		Endpoint:      ep.Name(),
		Attempt:       attempt,
	}, consumerPublisher{b})
	state := &deliveryState{}
	ctx = context.WithValue(ctx, stateKey{}, state) // for OnDuplicate
	run := func(txCtx context.Context) error {
		txCtx = context.WithValue(txCtx, stateKey{}, state)
		state.ran.Store(true)
		for _, r := range regs {
			err := callConsumer(txCtx, r, d)
			if overran(ctx, txCtx) {
				// The consumer returned after its HandlerTimeout: its
				// failure, whatever it returned, and not the database's
				// (the processed mark would fail with the deadline).
				return handlerTimeout(ep.HandlerTimeout, err)
			}
			if err != nil {
				return err
			}
		}
		// A transport whose queue is in this database acknowledges in
		// this transaction: the ack commits with the effects.
		if ta, ok := b.tr.(transport.TxAcker); ok {
			acked, err := ta.AckTx(txCtx, msg)
			if err != nil {
				return &inbox.StoreError{Op: "ack in transaction", Err: err}
			}
			state.ackedInTx.Store(acked)
		}
		return nil
	}

	// alone runs the attempt by itself: one lock, one transaction.
	alone := func() error {
		ctx := ctx
		if ep.HandlerTimeout > 0 { // per attempt, so that a retry gets its own time
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, ep.HandlerTimeout)
			defer cancel()
		}
		switch {
		case msg.UUID == "" && ep.MissingMessageID == endpoint.RejectMissingID:
			return endpoint.Permanent(ErrMissingMessageID)
		case msg.UUID == "" || ep.Inbox == endpoint.InboxOff:
			if msg.UUID == "" {
				log.WarnContext(ctx, "processing a message without an id: no deduplication", "message_type", typ)
			}
			return b.inTx(ctx, run)
		}
		orig := msg.Context()
		msg.SetContext(ctx) // the middleware reads the attempt's context from the message
		_, err := mw.Middleware(func(m *message.Message) ([]*message.Message, error) {
			return nil, run(m.Context())
		})(msg)
		msg.SetContext(orig)
		return err
	}
	var err error
	if bt := b.batchers[ep.Name()]; bt != nil && msg.UUID != "" {
		// Group commit (batch.go); what a batch cannot settle runs alone.
		var fallback bool
		if fallback, err = bt.submit(ctx, msg.UUID, run, state, alone); fallback {
			err = alone()
		} else {
			// The batch settled it: a duplicate of this process waiting
			// for its lock looks again at once.
			mw.Settled.Settle(inbox.Key{MessageID: msg.UUID, ConsumerType: ep.Name()})
		}
	} else {
		err = alone()
	}
	switch {
	case err != nil:
		return "", err
	case state.ran.Load():
		if state.ackedInTx.Load() {
			b.tr.(transport.TxAcker).AckedInTx(msg)
		}
		if state.published.Load() {
			b.wake()
		}
		return OutcomeCommitted, nil
	case state.duplicate.Load():
		return OutcomeDuplicate, nil
	}
	return OutcomeAcked, nil
}

// inTx runs fn in a transaction of its own (b.runTx, as b.Transaction's:
// two round trips for a consumer that runs one statement on PostgreSQL
// with the plugin) and commits it: the consumers of a message without the
// inbox (InboxOff, or no id). A failure to begin or commit is the
// database's (an inbox.StoreError), fn's error is fn's.
func (b *Bus) inTx(ctx context.Context, fn func(ctx context.Context) error) error {
	var fnErr error
	err := b.runTx(ctx, func(tx *gorm.DB) error {
		fnErr = fn(gormstore.WithTx(ctx, tx))
		return fnErr
	})
	if err != nil && fnErr == nil { // begin or commit failed, not the consumer
		return &inbox.StoreError{Op: "transaction", Err: err}
	}
	return err
}

func callConsumer(ctx context.Context, r *endpoint.Registration, d *endpoint.Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: string(debug.Stack())}
		}
	}()
	if err := r.Handle(plumb.Token{}, ctx, d); err != nil {
		return fmt.Errorf("consumer %s: %w", r.Name, err)
	}
	return nil
}

// redeliveries says whether the failed message gets a delayed redelivery,
// and how many it has had.
func redeliveries(ep *endpoint.Endpoint, msg *message.Message, err error) (int, bool) {
	if len(ep.Redelivery) == 0 || endpoint.IsPermanent(err) || (ep.Retry.ShouldRetry != nil && !ep.Retry.ShouldRetry(err)) {
		return 0, false
	}
	n, _ := strconv.Atoi(msg.Metadata.Get(wire.HeaderRedeliveryCount))
	if n < 0 || n >= len(ep.Redelivery) {
		return n, false
	}
	return n, true
}

// redeliver schedules the next delayed redelivery as an outbox row for the
// endpoint's own queue, claimable once the delay has passed (the
// database's clock). It returns after the row committed, and only then is
// the original acked: the message is always in the queue or the outbox,
// across restarts, on every transport, with no broker-side delay queue.
func (b *Bus) redeliver(ctx context.Context, ep *endpoint.Endpoint, msg *message.Message, n int, cause error) error {
	m := copyOf(msg, wire.QueuePrefix+ep.Name())
	m.Headers[wire.HeaderRedeliveryCount] = strconv.Itoa(n + 1)
	m.Headers[wire.HeaderFaultReason] = wire.Truncate(cause.Error(), maxFaultReason)
	m.Delay = ep.Redelivery[n]
	return b.inTx(ctx, func(ctx context.Context) error { return b.outboxSt.Add(ctx, []*outbox.Message{m}) })
}

// copyOf makes an outbox message of a received one, for dest: same id,
// type, body and headers.
func copyOf(msg *message.Message, dest string) *outbox.Message {
	h := map[string]string{}
	maps.Copy(h, msg.Metadata)
	for _, k := range []string{transport.MetaRedelivered, transport.MetaDeliveryCount, wire.HeaderMessageID,
		wire.HeaderMessageType, wire.HeaderContentType, wire.HeaderCorrelationID} {
		delete(h, k)
	}
	return &outbox.Message{
		MessageID:     msg.UUID,
		MessageType:   msg.Metadata.Get(wire.HeaderMessageType),
		ContentType:   msg.Metadata.Get(wire.HeaderContentType),
		CorrelationID: msg.Metadata.Get(wire.HeaderCorrelationID),
		Payload:       msg.Payload,
		Destination:   dest,
		Headers:       h,
	}
}

// deadLetter makes the message for the endpoint's dead-letter destination,
// with fault headers.
func deadLetter(ep *endpoint.Endpoint, msg *message.Message, cause error, attempts int) *outbox.Message {
	m := copyOf(msg, wire.QueuePrefix+ep.ErrorQueue)
	if id := storableID(msg.UUID); id != msg.UUID {
		// The dead letter must be storable itself: a stand-in id derived
		// from the bad one, which is kept (quoted) in a header.
		m.MessageID = id
		m.Headers[wire.HeaderFaultMessageID] = quoteID(msg.UUID)
	}
	if ep.Queue.DeadLetterExchange != "" {
		m.Destination = wire.ExchangePrefix + ep.Queue.DeadLetterExchange
		m.RoutingKey = ep.Queue.DeadLetterRoutingKey
	}
	h := m.Headers
	h[wire.HeaderFaultReason] = wire.Truncate(cause.Error(), maxFaultReason)
	h[wire.HeaderFaultType] = errorType(cause)
	h[wire.HeaderFaultEndpoint] = ep.Name()
	h[wire.HeaderFaultAttempts] = strconv.Itoa(attempts)
	h[wire.HeaderFaultTime] = time.Now().UTC().Format(time.RFC3339Nano)
	if dest := msg.Metadata.Get(wire.HeaderDestination); dest != "" {
		kind, name := wire.ParseDestination(dest)
		if kind == "exchange" {
			h[wire.HeaderFaultExchange] = name
		} else {
			h[wire.HeaderFaultRoutingKey] = name
		}
	}
	var pe *PanicError
	if errors.As(cause, &pe) {
		h[wire.HeaderFaultStack] = wire.Truncate(pe.Stack, maxFaultStack)
	}
	return m
}

func errorType(err error) string {
	// The innermost error's type says most about the cause.
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return fmt.Sprintf("%T", err)
		}
		err = next
	}
}

type incremental struct {
	first, step, cur time.Duration
}

func (b *incremental) Reset() { b.cur = 0 }
func (b *incremental) NextBackOff() time.Duration {
	if b.cur == 0 {
		b.cur = b.first
	} else {
		b.cur += b.step
	}
	return b.cur
}

func retryBackOff(p endpoint.RetryPolicy) backoff.BackOff {
	switch p.Kind {
	case endpoint.RetryImmediate, endpoint.RetryNone:
		return &backoff.ZeroBackOff{}
	case endpoint.RetryInterval:
		return backoff.NewConstantBackOff(p.Interval)
	case endpoint.RetryIncremental:
		return &incremental{first: p.Interval, step: p.Increment}
	default:
		e := backoff.NewExponentialBackOff()
		e.InitialInterval = p.Interval
		e.MaxInterval = p.MaxInterval
		if e.MaxInterval == 0 {
			e.MaxInterval = 30 * time.Second
		}
		e.Multiplier = 2
		if p.Multiplier != 0 {
			e.Multiplier = p.Multiplier
		}
		e.RandomizationFactor = p.RandomizationFactor
		return e
	}
}
