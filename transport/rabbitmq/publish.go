package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// publisher is one confirm-mode channel. Publishes are serialized on it.
// Each publish is judged by its own DeferredConfirmation, which amqp091
// settles the moment the broker's ack or nack for it arrives, whatever the
// order. The channel's NotifyPublish is not used: amqp091 (v1.16.0,
// unchanged in v1.17.0) hands a multiple ack to every tag from the one it
// expects next up to the ack's tag, overwriting a nack it already holds for
// a tag in between, so a nack read there can come out as an ack (issue 31:
// 35 of 300 in TestNackAmongAcksIsNeverReadAsAck); and it resequences
// confirms, so one destination that never confirms holds back the
// notifications of every later publish on the channel (issue 33:
// TestSilentDestinationIsChargedNotTheTransport).
//
// One goroutine (run) takes the channel's returns and its close. amqp091's
// single reader hands a basic.return over (the return channel is
// unbuffered) before it reads the basic.ack of the same message, so once a
// publish's confirmation is settled its return, if any, has been received
// by run; sync waits until run has recorded it.
type publisher struct {
	conn    *amqp.Connection // the connection ch is on
	t       *Transport
	ch      *amqp.Channel
	mu      sync.Mutex    // serializes publishing on ch
	sem     chan struct{} // one slot per unconfirmed publish
	barrier chan chan struct{}

	pmu      sync.Mutex
	pending  map[uint64]*pending // by delivery tag
	dead     bool
	deadErr  error
	nacked   bool                   // the broker nacked a publish on ch: retire it
	stale    bool                   // a confirm did not come in time: retire it
	nackedTo map[destination]uint64 // the first nacked tag of each destination
	done     chan struct{}          // closed once the channel is gone

	// users counts the Deliver calls holding the shared publisher;
	// retired means getPublisher hands it out no more: the last user
	// closes its channel (both under Transport.pubMu).
	users   int
	retired bool
}

// pending is one published message awaiting its confirm.
type pending struct {
	tag       uint64
	exchange  string
	key       string
	messageID string
	mandatory bool
	returned  *amqp.Return // set by run, under pmu
	// confirm is the publish's own verdict (nil when the publish failed):
	// done on the broker's ack or nack, or as a nack when the channel
	// closes.
	confirm *amqp.DeferredConfirmation
}

// destination is where a publish went: its exchange and routing key.
type destination struct{ exchange, key string }

// getPublisher returns the current publisher channel, opening one when
// needed. It never waits for a reconnect, nor for a channel open longer
// than ctx allows: the open runs once for every caller waiting for it,
// outside pubMu, bounded as a call (bounded). The caller hands it back
// with releasePublisher.
func (t *Transport) getPublisher(ctx context.Context) (*publisher, error) {
	for {
		t.pubMu.Lock()
		if t.pubClosed {
			t.pubMu.Unlock()
			return nil, fmt.Errorf("%w: %w", outbox.ErrTransportUnavailable, errClosed)
		}
		if p := t.pub; p != nil && !p.retired {
			select {
			case <-p.done:
			default:
				if !p.ch.IsClosed() {
					p.users++
					t.pubMu.Unlock()
					return p, nil
				}
			}
		}
		t.pub = nil
		op := t.pubOpening
		if op == nil {
			op = &pubOpen{done: make(chan struct{})}
			t.pubOpening = op
			go t.openShared(op)
		}
		t.pubMu.Unlock()
		select {
		case <-op.done:
			if op.err != nil {
				return nil, op.err
			}
			// The new publisher is t.pub unless it went already: look again.
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: rabbitmq: waiting for a publish channel: %w", outbox.ErrTransportUnavailable, ctx.Err())
		}
	}
}

// pubOpen is an open of the shared publisher in progress.
type pubOpen struct {
	done chan struct{}
	err  error
}

// openShared opens the shared publisher for getPublisher's callers.
func (t *Transport) openShared(op *pubOpen) {
	p, err := t.openPublisher()
	t.pubMu.Lock()
	t.pubOpening = nil
	switch {
	case err != nil:
		op.err = err
	case t.pubClosed:
		op.err = fmt.Errorf("%w: %w", outbox.ErrTransportUnavailable, errClosed)
		t.closeChannel(p.conn, p.ch)
	default:
		t.pub = p
	}
	close(op.done)
	t.pubMu.Unlock()
}

// releasePublisher hands back a publisher from getPublisher. One on which
// the broker nacked a publish is retired: later publishes get a new
// channel, and the last user closes the old one.
//
// Why: a quorum queue's broker-side client state belongs to the channel.
// On RabbitMQ 3.10 a channel that first publishes to a quorum queue while
// the queue's leader node has just died (before a new leader is elected,
// well under a second) has every later publish to that queue nacked, for
// as long as the old leader stays down (measured: 20 s and more, while
// a new channel on the same connection was confirmed 1 s after the kill).
// Retiring the channel at the first nack ends that; a nack for a reason
// that lasts (a full queue with overflow reject-publish) costs one
// channel per batch.
//
// TestProbeQuorumLeaderLoss once measured such a channel acking publishes
// that never reached the queue, every one after a nack on its channel; read
// per publish (issue 31), those acks were nacks that amqp091's
// NotifyPublish had folded into a later multiple ack (docs/guarantees.md,
// known defects). judge still does not trust an ack that follows a
// nack to the same destination on the same channel: Deliver sends that
// message again on a new channel (a duplicate when the ack was true, which
// the receiving inbox absorbs).
func (t *Transport) releasePublisher(p *publisher) {
	p.pmu.Lock()
	nacked := p.nacked || p.stale
	p.pmu.Unlock()
	t.pubMu.Lock()
	p.users--
	if nacked && !p.retired {
		p.retired = true
		if t.pub == p {
			t.pub = nil
		}
		t.log.Debug("rabbitmq publish channel retired after a nack or a missing confirm")
	}
	closeIt := p.retired && p.users == 0
	t.pubMu.Unlock()
	if closeIt {
		t.closeChannel(p.conn, p.ch)
	}
}

// openPublisher opens a confirm-mode channel on the current connection. The
// caller owns it: getPublisher shares it, isolate uses it alone.
func (t *Transport) openPublisher() (*publisher, error) {
	conn, err := t.currentConn()
	if err != nil {
		return nil, err
	}
	var ch *amqp.Channel
	err = t.bounded(conn, "open publish channel", func() (err error) {
		ch, err = conn.Channel()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: rabbitmq: open publish channel: %w", outbox.ErrTransportUnavailable, t.secret.scrubErr(err))
	}
	if err := t.bounded(conn, "enable publisher confirms", func() error { return ch.Confirm(false) }); err != nil {
		t.closeChannel(conn, ch)
		return nil, fmt.Errorf("%w: rabbitmq: enable publisher confirms: %w", outbox.ErrTransportUnavailable, t.secret.scrubErr(err))
	}
	p := &publisher{
		t:       t,
		conn:    conn,
		ch:      ch,
		sem:     make(chan struct{}, t.cfg.MaxPendingPublishes),
		barrier: make(chan chan struct{}),
		pending: map[uint64]*pending{},
		done:    make(chan struct{}),
	}
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	returns := ch.NotifyReturn(make(chan amqp.Return)) // unbuffered: see publisher
	t.pubWG.Add(1)
	go p.run(returns, closes)
	return p, nil
}

func (p *publisher) run(returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	defer p.t.pubWG.Done()
	for returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.onReturn(r)
		case b := <-p.barrier:
			close(b)
		}
	}
	var reason error = amqp.ErrClosed
	select {
	case e, ok := <-closes:
		if ok && e != nil {
			reason = e
		}
	default:
	}
	p.fail(reason)
}

// take removes the pending entry of tag and frees its slot. Whoever removes
// an entry frees its slot, exactly once.
func (p *publisher) take(tag uint64) *pending {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	pp := p.pending[tag]
	if pp != nil {
		delete(p.pending, tag)
		<-p.sem
	}
	return pp
}

// reap frees pp's slot once the broker has judged it (or the channel is
// gone), so that publishing goes on while earlier publishes are awaited.
// A mandatory publish's entry stays until run has handled the returns read
// before its ack (sync): onReturn finds it there.
func (p *publisher) reap(pp *pending) {
	select {
	case <-pp.confirm.Done():
		if pp.mandatory {
			p.sync()
		}
	case <-p.done:
	}
	p.take(pp.tag)
}

// sync returns once run has handled every return amqp091 handed over
// before now (see publisher), or the channel is gone.
func (p *publisher) sync() {
	b := make(chan struct{})
	select {
	case p.barrier <- b:
		<-b
	case <-p.done:
	}
}

// judge turns the broker's verdict on pp (ack true or false, the channel
// still open) into pp's error: nil when it was confirmed. Call it in tag
// order: an ack to a destination that had a publish nacked before it on
// this channel is not trusted.
func (p *publisher) judge(pp *pending, ack bool) error {
	dest := destination{pp.exchange, pp.key}
	p.pmu.Lock()
	first, wasNacked := p.nackedTo[dest]
	afterNack := wasNacked && first < pp.tag
	if !ack {
		p.nacked = true
		if p.nackedTo == nil {
			p.nackedTo = map[destination]uint64{}
		}
		if !wasNacked || pp.tag < first {
			p.nackedTo[dest] = pp.tag
		}
	}
	returned := pp.returned
	p.pmu.Unlock()
	if !ack && p.t != nil {
		p.t.suspectDest(dest)
	}
	switch {
	case !ack:
		return &nackedError{messageID: pp.messageID, exchange: pp.exchange, key: pp.key}
	case afterNack:
		// Not trusted: TestProbeQuorumLeaderLoss once showed a channel
		// that got a nack from a quorum queue without a leader acking
		// publishes to that queue that it never held (see
		// releasePublisher; most, perhaps all, were nacks amqp091 had
		// misreported). Deliver sends the message again on a new
		// channel, as if it had been nacked. Publishes to other
		// destinations are judged on their own: a full reject-publish
		// queue must not charge its neighbours.
		return &nackedError{messageID: pp.messageID, exchange: pp.exchange, key: pp.key, ackAfterNack: true}
	case returned != nil:
		return &ReturnedError{MessageID: pp.messageID, Exchange: pp.exchange, RoutingKey: pp.key,
			Code: returned.ReplyCode, Text: returned.ReplyText}
	}
	return nil
}

// onReturn marks the oldest unconfirmed publish that matches the returned
// message; the confirm that follows turns it into an error.
func (p *publisher) onReturn(r amqp.Return) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	var match *pending
	for _, pp := range p.pending {
		if pp.returned == nil && pp.exchange == r.Exchange && pp.key == r.RoutingKey && pp.messageID == r.MessageId &&
			(match == nil || pp.tag < match.tag) {
			match = pp
		}
	}
	if match != nil {
		match.returned = &r
		return
	}
	p.t.log.Warn("rabbitmq returned a message that matches no pending publish",
		slog.String("message_id", r.MessageId), slog.String("exchange", r.Exchange),
		slog.String("routing_key", r.RoutingKey), slog.String("reason", r.ReplyText))
}

// fail ends the publisher when its channel is gone: it frees the slots of
// the publishes still unconfirmed (their waiters read deadError) and
// closes done.
func (p *publisher) fail(reason error) {
	p.pmu.Lock()
	p.dead = true
	p.deadErr = reason
	for tag := range p.pending {
		delete(p.pending, tag)
		<-p.sem
	}
	p.pmu.Unlock()
	close(p.done)

	t := p.t
	t.pubMu.Lock()
	if t.pub == p {
		t.pub = nil
	}
	retired := p.retired
	t.pubMu.Unlock()
	if !retired {
		// Closed under us (not retired after a nack, which signals its
		// destination only): every destination may be affected.
		t.suspect("publish channel closed")
	}
	if isRefusal(reason) {
		// The broker closed the channel over one publish (NOT_FOUND: an
		// exchange was deleted under us, ...): forget the exchanges we
		// believed exist so that they get declared again.
		t.forgetExchanges()
		t.log.Warn("rabbitmq publish channel closed by the broker", slog.String("error", t.secret.scrub(reason.Error())))
	}
}

// isChannelException reports whether code closes a channel rather than the
// connection.
func isChannelException(code int) bool {
	switch code {
	case amqp.ContentTooLarge, amqp.NoRoute, amqp.NoConsumers, amqp.AccessRefused, amqp.NotFound, amqp.ResourceLocked, amqp.PreconditionFailed:
		return true
	}
	return false
}

// nackedError is the error of a publish the broker nacked: a queue it was
// routed to did not take it (a quorum queue without a leader, a full
// queue with overflow reject-publish, a queue process that failed).
//
// ackAfterNack marks a publish the broker acked after it had nacked another
// one on the same channel: such an ack is not trusted, and the message is
// handled as nacked.
type nackedError struct {
	messageID, exchange, key string
	ackAfterNack             bool
}

func (e *nackedError) Error() string {
	if e.ackAfterNack {
		return fmt.Sprintf("rabbitmq: broker acked message %q to exchange %q with routing key %q after nacking another publish on the same channel (not trusted: see docs/guarantees.md)", e.messageID, e.exchange, e.key)
	}
	return fmt.Sprintf("rabbitmq: broker rejected (nacked) message %q to exchange %q with routing key %q", e.messageID, e.exchange, e.key)
}

// ReturnedError is the error of a mandatory publish that the broker returned
// because no queue received it.
type ReturnedError struct {
	MessageID  string
	Exchange   string
	RoutingKey string
	Code       uint16
	Text       string
}

// Unwrap makes the error match transport.ErrUnroutable, and, for a send to
// a queue (the default exchange), outbox.ErrUndeliverable: that queue does
// not exist, so the relay parks the row at once — with the broker's reason,
// for an operator to requeue once the queue exists — rather than retrying it
// for minutes (a publish to an exchange nobody is bound to yet is retried).
func (e *ReturnedError) Unwrap() []error {
	if e.Exchange == "" {
		return []error{transport.ErrUnroutable, outbox.ErrUndeliverable}
	}
	return []error{transport.ErrUnroutable}
}

func (e *ReturnedError) Error() string {
	dest := fmt.Sprintf("exchange %q with routing key %q", e.Exchange, e.RoutingKey)
	if e.Exchange == "" {
		dest = fmt.Sprintf("queue %q (no such queue?)", e.RoutingKey)
	}
	return fmt.Sprintf("rabbitmq: message %q to %s was returned unroutable: %d %s", e.MessageID, dest, e.Code, e.Text)
}

// job is one message ready to publish.
type job struct {
	i         int
	exchange  string
	key       string
	mandatory bool
	pub       amqp.Publishing
	wait      *pending
	sent      time.Time // when it was last published (the suspect window)
	judged    bool      // the broker acked or nacked its last publish
}

// Deliver publishes msgs on the confirm-mode channel, all of them before
// waiting for any confirm, and returns one error per message in order: nil
// means the broker confirmed it. "exchange:X" goes to exchange X (declared as
// a durable fanout exchange on first use if it does not exist) with the
// message's routing key; "queue:Q" goes to queue Q through the default
// exchange as a mandatory publish, so a missing queue is an error. Errors
// wrapping outbox.ErrTransportUnavailable mean the broker did not judge the
// message; errors wrapping outbox.ErrUndeliverable, that it cannot be
// encoded (checked before any frame is written). A refusal that closes the
// channel is charged to the refused message only (see isolate).
func (t *Transport) Deliver(ctx context.Context, msgs []*outbox.Message) []error {
	return t.deliver(ctx, msgs, t.cfg.Mandatory)
}

// DeliverMandatory is Deliver with every publish mandatory: a message no
// queue receives fails with a *ReturnedError (wrapping
// transport.ErrUnroutable) instead of vanishing. Dead letters use it.
func (t *Transport) DeliverMandatory(ctx context.Context, msgs []*outbox.Message) []error {
	return t.deliver(ctx, msgs, true)
}

func (t *Transport) deliver(ctx context.Context, msgs []*outbox.Message, mandatory bool) []error {
	errs, jobs := t.deliverOnce(ctx, msgs, mandatory)
	if t.cfg.SuspectWindow > 0 && t.anySignal.Load() && len(jobs) > 0 {
		idx := make([]int, len(msgs))
		for i := range idx {
			idx[i] = i
		}
		t.resendSuspects(ctx, msgs, mandatory, errs, jobs, idx)
	}
	return errs
}

// deliverOnce publishes msgs and waits for their confirms (a nacked one
// sent once more, a refused channel's messages isolated); it returns one
// error per message and the jobs it published.
func (t *Transport) deliverOnce(ctx context.Context, msgs []*outbox.Message, mandatory bool) ([]error, []*job) {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs, nil
	}
	failAll := func(err error) ([]error, []*job) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs, nil
	}
	if err := ctx.Err(); err != nil {
		return failAll(fmt.Errorf("%w: %w", outbox.ErrTransportUnavailable, err))
	}
	if reason := t.blocked.Load(); reason != nil {
		return failAll(fmt.Errorf("%w: rabbitmq: broker blocks publishing: %s", outbox.ErrTransportUnavailable, *reason))
	}
	gctx, gcancel := context.WithTimeout(ctx, t.cfg.PublishTimeout)
	p, err := t.getPublisher(gctx)
	gcancel()
	if err != nil {
		return failAll(err)
	}
	defer func() {
		if p != nil {
			t.releasePublisher(p)
		}
	}()

	now := time.Now()
	rules := wire.Rules{MaxHeaderBytes: t.maxHeaderBytes()}
	jobs := make([]*job, 0, len(msgs))
	for i, m := range msgs {
		if m == nil {
			errs[i] = errors.New("rabbitmq: nil message")
			continue
		}
		// amqp091 closes the whole connection over a frame it cannot
		// encode (a short string over 255 bytes): refuse such a message
		// alone, before any frame is written.
		if err := wire.Validate(m, rules); err != nil {
			errs[i] = fmt.Errorf("%w: rabbitmq: message %q: %w", outbox.ErrUndeliverable, m.MessageID, err)
			continue
		}
		kind, name := wire.ParseDestination(m.Destination)
		j := &job{i: i, pub: toPublishing(m, now)}
		switch {
		case name == "":
			errs[i] = fmt.Errorf("rabbitmq: message %q has no destination (want exchange:<name> or queue:<name>)", m.MessageID)
			continue
		case kind == "exchange":
			if err := t.ensureExchange(name); err != nil {
				errs[i] = fmt.Errorf("rabbitmq: message %q: %w", m.MessageID, err)
				continue
			}
			j.exchange, j.key, j.mandatory = name, m.RoutingKey, mandatory
		default:
			j.exchange, j.key, j.mandatory = "", name, true
		}
		jobs = append(jobs, j)
	}

	// The confirm wait is bounded by PublishTimeout, counted from the moment
	// the batch starts publishing.
	wctx, cancel := context.WithTimeout(ctx, t.cfg.PublishTimeout)
	defer cancel()
	p.publishAll(wctx, jobs, errs)

	var nacked []*job
	p.await(ctx, wctx, jobs, errs)
	for _, j := range jobs {
		var ne *nackedError
		if errors.As(errs[j.i], &ne) {
			nacked = append(nacked, j)
		}
	}
	if len(nacked) > 0 {
		// Once more on a new channel (see releasePublisher): a message
		// nacked again is charged to its row, which the relay retries
		// after its own delay.
		t.releasePublisher(p)
		if p, err = t.getPublisher(wctx); err != nil {
			p = nil // nothing to release; the nack errors stand
		} else {
			for _, j := range nacked {
				j.wait = nil
			}
			p.publishAll(wctx, nacked, errs)
			p.await(ctx, wctx, nacked, errs)
		}
	}
	var again []*job
	for _, j := range jobs {
		var cre *channelRefusedError
		if errors.As(errs[j.i], &cre) {
			again = append(again, j)
		}
	}
	if len(again) > 0 {
		t.isolate(wctx, again, errs)
	}
	t.chargeSilent(ctx, jobs, errs)
	return errs, jobs
}

// await waits for the verdicts of jobs published on p (until wctx is
// done) and records them in errs, in tag order.
func (p *publisher) await(ctx, wctx context.Context, jobs []*job, errs []error) {
	var judged []*job
	returnable := false
	for _, j := range jobs {
		pp := j.wait
		if pp == nil {
			continue // the publish itself failed: errs says why
		}
		select {
		case <-pp.confirm.Done():
		case <-wctx.Done():
		}
		select { // a verdict that came wins over a deadline passed meanwhile
		case <-pp.confirm.Done():
			judged = append(judged, j)
			returnable = returnable || pp.mandatory
		default:
			errs[j.i] = p.t.waitErr(ctx, j)
			// Retire the channel: closing it settles what it leaves
			// unconfirmed, so that a destination that never confirms
			// cannot keep publish slots (MaxPendingPublishes) taken.
			p.pmu.Lock()
			p.stale = true
			p.pmu.Unlock()
		}
	}
	if returnable {
		p.sync() // a return read before an ack is recorded before we judge
	}
	for _, j := range judged {
		pp := j.wait
		ack := pp.confirm.Acked()
		if !ack && p.ch.IsClosed() {
			// A closing channel settles what it leaves unconfirmed as
			// nacked: the broker did not judge these.
			<-p.done
			errs[j.i] = p.deadError(j)
			continue
		}
		j.judged = true
		errs[j.i] = p.judge(pp, ack)
	}
}

// chargeSilent charges to their messages the confirms that did not come
// within PublishTimeout while the broker answered: a destination that
// never confirms (a quorum queue without a majority, a stuck queue
// process) fails its rows like any refusal, so that the relay counts
// attempts and parks them, rather than retrying them first in line for
// ever as if the broker were down. The broker answered when another
// message of the same Deliver was acked or nacked, or when it opens a
// channel within confirmProbeTimeout now.
func (t *Transport) chargeSilent(ctx context.Context, jobs []*job, errs []error) {
	var silent []*job
	answered := false
	for _, j := range jobs {
		var te *confirmTimeoutError
		if errors.As(errs[j.i], &te) {
			silent = append(silent, j)
		}
		answered = answered || j.judged
	}
	if len(silent) == 0 || ctx.Err() != nil || t.blocked.Load() != nil {
		return
	}
	if !answered && !t.brokerAnswers(ctx) {
		return
	}
	for _, j := range silent {
		errs[j.i] = &silentError{messageID: j.pub.MessageId, exchange: j.exchange, key: j.key, timeout: t.cfg.PublishTimeout}
	}
}

// confirmProbeTimeout bounds brokerAnswers.
const confirmProbeTimeout = 2 * time.Second

// brokerAnswers reports whether the broker opens (and closes) a channel on
// the current connection within confirmProbeTimeout.
func (t *Transport) brokerAnswers(ctx context.Context) bool {
	conn, err := t.currentConn()
	if err != nil {
		return false
	}
	var ch *amqp.Channel
	err, answered := within(ctx, confirmProbeTimeout, func() (err error) {
		ch, err = conn.Channel()
		return err
	})
	if !answered || err != nil {
		return false
	}
	t.closeChannel(conn, ch)
	return true
}

// silentError is the error of a publish the broker did not confirm within
// PublishTimeout while it answered otherwise: the destination's fault,
// charged to the message (it does not wrap outbox.ErrTransportUnavailable).
type silentError struct {
	messageID, exchange, key string
	timeout                  time.Duration
}

func (e *silentError) Error() string {
	return fmt.Sprintf("rabbitmq: no confirm for message %q to exchange %q with routing key %q within publish timeout %v while the broker answers: the destination does not (a quorum queue without a majority, a queue process that hangs)",
		e.messageID, e.exchange, e.key, e.timeout)
}

// confirmTimeoutError is the error of a publish not confirmed within
// PublishTimeout, until chargeSilent decides whose fault it is.
type confirmTimeoutError struct {
	messageID string
	timeout   time.Duration
}

func (e *confirmTimeoutError) Error() string {
	return fmt.Sprintf("rabbitmq: no confirm for message %q within publish timeout %v", e.messageID, e.timeout)
}

func (e *confirmTimeoutError) Unwrap() error { return outbox.ErrTransportUnavailable }

// maxHeaderBytes bounds a message's properties and headers so that its
// content header fits one frame of the current connection.
func (t *Transport) maxHeaderBytes() int {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	frame := 131072 // RabbitMQ's default frame_max
	if c != nil && c.Config.FrameSize > 0 {
		frame = c.Config.FrameSize
	}
	return frame - 64 // frame header and end, content header fields
}

func (t *Transport) waitErr(ctx context.Context, j *job) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: rabbitmq: gave up waiting for the confirm of message %q: %w", outbox.ErrTransportUnavailable, j.pub.MessageId, err)
	}
	return &confirmTimeoutError{messageID: j.pub.MessageId, timeout: t.cfg.PublishTimeout}
}

// publishAll publishes every job, waiting for a free slot whenever
// MaxPendingPublishes publishes are unconfirmed.
func (p *publisher) publishAll(ctx context.Context, jobs []*job, errs []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, j := range jobs {
		select {
		case p.sem <- struct{}{}:
		case <-p.done:
			for _, rest := range jobs[n:] {
				errs[rest.i] = p.deadError(rest)
			}
			return
		case <-ctx.Done():
			for _, rest := range jobs[n:] {
				errs[rest.i] = p.t.waitErr(ctx, rest)
			}
			return
		}
		tag := p.ch.GetNextPublishSeqNo()
		pp := &pending{tag: tag, exchange: j.exchange, key: j.key, messageID: j.pub.MessageId, mandatory: j.mandatory}
		p.pmu.Lock()
		if p.dead {
			<-p.sem
			p.pmu.Unlock()
			errs[j.i] = p.deadError(j)
			continue
		}
		p.pending[tag] = pp
		p.pmu.Unlock()

		j.sent = time.Now()
		dc, err := p.ch.PublishWithDeferredConfirm(j.exchange, j.key, j.mandatory, false, j.pub)
		if err == nil && dc == nil {
			err = errors.New("channel not in confirm mode") // cannot happen: openPublisher set it
		}
		if err != nil {
			p.take(tag)
			if p.ch.IsClosed() {
				// The channel closed under us, likely over a neighbour's
				// refusal: once the publisher has the reason, deadError
				// tells an innocent bystander from a lost connection.
				select {
				case <-p.done:
					errs[j.i] = p.deadError(j)
					continue
				case <-ctx.Done():
				}
			}
			errs[j.i] = fmt.Errorf("%w: rabbitmq: publish message %q: %w", outbox.ErrTransportUnavailable, j.pub.MessageId, p.t.secret.scrubErr(err))
			continue
		}
		if dc.DeliveryTag != tag {
			// Cannot happen while every publish on ch goes through p.mu.
			p.t.log.Error("rabbitmq publish sequence mismatch", slog.Uint64("expected", tag), slog.Uint64("got", dc.DeliveryTag))
		}
		pp.confirm = dc
		j.wait = pp
		go p.reap(pp)
	}
}

func (p *publisher) deadError(j *job) error {
	p.pmu.Lock()
	reason := p.deadErr
	p.pmu.Unlock()
	if reason == nil {
		reason = amqp.ErrClosed
	}
	if isRefusal(reason) {
		// Closed over another message's refusal: this one was never judged.
		return &channelRefusedError{messageID: j.pub.MessageId, reason: p.t.secret.scrubErr(reason)}
	}
	return fmt.Errorf("%w: rabbitmq: publish channel closed, message %q not sent: %w", outbox.ErrTransportUnavailable, j.pub.MessageId, p.t.secret.scrubErr(reason))
}

// isRefusal reports whether reason is the broker closing a channel over a
// publish it refused (rather than the connection going away).
func isRefusal(reason error) bool {
	var aerr *amqp.Error
	return errors.As(reason, &aerr) && aerr.Server && isChannelException(aerr.Code)
}

// channelRefusedError is the result of a publish that was unconfirmed when
// the broker closed its channel over a refused publish: it may be the
// refused one or an innocent neighbour. Deliver never returns it.
type channelRefusedError struct {
	messageID string
	reason    error
}

func (e *channelRefusedError) Error() string {
	return fmt.Sprintf("rabbitmq: broker closed the publish channel before confirming message %q: %v", e.messageID, e.reason)
}

func (e *channelRefusedError) Unwrap() error { return e.reason }

// isolate publishes each job again on a channel of its own, one at a time,
// after the broker closed a shared channel over one of them: a refusal now
// can only be that job's, so it alone is charged; the others are confirmed
// (a copy may already have been routed before the channel closed: a
// duplicate the receiving inbox absorbs) or fail as unavailable.
func (t *Transport) isolate(ctx context.Context, jobs []*job, errs []error) {
	var p *publisher
	defer func() {
		if p != nil {
			t.closeChannel(p.conn, p.ch)
		}
	}()
	for _, j := range jobs {
		if ctx.Err() != nil {
			errs[j.i] = t.waitErr(ctx, j)
			continue
		}
		if p != nil && p.isDead() {
			t.closeChannel(p.conn, p.ch)
			p = nil
		}
		if j.exchange != "" {
			// A refusal made the transport forget the exchanges it knew.
			if err := t.ensureExchange(j.exchange); err != nil {
				errs[j.i] = fmt.Errorf("rabbitmq: message %q: %w", j.pub.MessageId, err)
				continue
			}
		}
		if p == nil {
			np, err := t.openPublisher()
			if err != nil {
				errs[j.i] = err
				continue
			}
			p = np
		}
		j.wait = nil
		p.publishAll(ctx, []*job{j}, errs)
		p.await(ctx, ctx, []*job{j}, errs)
		var cre *channelRefusedError
		if errors.As(errs[j.i], &cre) {
			errs[j.i] = fmt.Errorf("rabbitmq: broker refused message %q to exchange %q with routing key %q (it closed the channel): %w",
				j.pub.MessageId, j.exchange, j.key, cre.reason)
			// The channel is closing, whether or not the publisher has
			// noticed yet: the next message must not be judged on it.
			p = nil
		}
	}
}

func (p *publisher) isDead() bool {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	return p.dead
}

// ensureExchange makes sure exchange name exists before publishing to it:
// an existing exchange is used whatever its kind; a missing one is declared
// as a durable fanout exchange (so publishing a message type nobody consumes
// yet is not an error). Known exchanges are cached per connection.
func (t *Transport) ensureExchange(name string) error {
	if t.knownExchange(name) {
		return nil
	}
	conn, err := t.currentConn()
	if err != nil {
		return err
	}
	d := &declarer{t: t, conn: conn}
	d.ensureExchange(name)
	d.close()
	if len(d.errs) > 0 {
		return d.errs[0]
	}
	return nil
}
