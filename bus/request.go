package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/internal/detach"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// DefaultRequestTimeout is how long Request waits for a response when no
// WithRequestTimeout option is given (MassTransit's default too).
const DefaultRequestTimeout = 30 * time.Second

// FaultMessageType is the message type of the response the bus sends for a
// request whose consumer failed: Request turns it into a
// *RequestFaultError.
const FaultMessageType = "barewire.Fault"

// Errors returned by Request.
var (
	// ErrRequestTimeout is wrapped by the error of a request that got no
	// response within its timeout.
	ErrRequestTimeout = errors.New("bus: request timed out")
	// ErrNoConsumer is wrapped by the error of a request that reached no
	// queue: nobody consumes its destination. It is returned at once, not
	// after the timeout.
	ErrNoConsumer = errors.New("bus: request reached no queue")
	// ErrRequestUnsupported is returned by Request on a transport that
	// cannot give the bus a reply queue (one that does not implement
	// transport.ReplyQueues).
	ErrRequestUnsupported = errors.New("bus: the transport has no reply queues (transport.ReplyQueues), which requests need; use the RabbitMQ, PostgreSQL, in-process or Watermill (wmpubsub) transport")
	// ErrUnexpectedResponse is wrapped by the error of a response whose
	// message type is not the one Request was asked to decode.
	ErrUnexpectedResponse = errors.New("bus: unexpected response type")
	// ErrRequestInTransaction is returned at once by a Request made inside
	// a transaction (a consumer's, or Transaction's) on SQLite to an
	// endpoint of the same bus: the transaction holds SQLite's one
	// connection, which the responding consumer needs for its inbox, so
	// the request could only time out.
	ErrRequestInTransaction = errors.New("bus: a request to an endpoint of this bus from inside a transaction on SQLite cannot be answered: the transaction holds SQLite's only connection, which the responder needs. Send the request (Send with the HeaderResponseAddress of an endpoint that consumes the response) and handle the response in that endpoint, make the request before the transaction, or use PostgreSQL")
)

// RequestFaultError is the error Request returns when the request's consumer
// failed: the request was dead-lettered after its retries (or at once, for a
// permanent error), and the bus answered with the fault.
type RequestFaultError struct {
	// RequestID is the request's message id.
	RequestID string
	// Endpoint is the endpoint whose consumer failed.
	Endpoint string
	// Type is the Go type of the innermost error the consumer returned
	// (BW-Fault-Type), "*bus.PanicError" for a panic.
	Type string
	// Message is the consumer's error text (BW-Fault-Reason).
	Message string
	// Attempts is how many attempts ran.
	Attempts int
}

func (e *RequestFaultError) Error() string {
	return fmt.Sprintf("bus: request %s failed in endpoint %q after %d attempt(s): %s (%s)", e.RequestID, e.Endpoint, e.Attempts, e.Message, e.Type)
}

// faultBody is the body of a fault response, for non-Go readers.
type faultBody struct {
	RequestID string `json:"requestId"`
	Endpoint  string `json:"endpoint"`
	Type      string `json:"type"`
	Message   string `json:"message"`
	Attempts  int    `json:"attempts"`
}

// RequestOption adjusts one Request call.
type RequestOption func(*requestConfig) error

type requestConfig struct {
	timeout time.Duration
	headers Headers
}

// WithRequestTimeout sets how long Request waits for the response, counted
// from the call (sending included). Defaults to DefaultRequestTimeout (30s).
func WithRequestTimeout(d time.Duration) RequestOption {
	return func(c *requestConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithRequestTimeout(%v): the timeout must be positive", ErrInvalidOption, d)
		}
		c.timeout = d
		return nil
	}
}

// WithRequestHeaders sets the request's headers, as Send's headers do
// ("message-id", "correlation-id", ...). BW-ResponseAddress is the bus's.
func WithRequestHeaders(h Headers) RequestOption {
	return func(c *requestConfig) error {
		c.headers = h
		return nil
	}
}

// Request sends req to destination (an endpoint's name, "queue:name" or
// "exchange:name", as Send) and waits for the response, decoded into Resp.
//
// The request leaves at once, straight to the transport, also when ctx
// carries a consumer's transaction: waiting in a transaction for the answer
// to a message that the same transaction holds back would never end. The
// publish is mandatory, so a request nobody consumes fails at once with an
// error wrapping ErrNoConsumer. The request carries the bus instance's
// reply queue in BW-ResponseAddress; its message id is the key the response
// comes back under (BW-RequestId). While Stop drains the bus, Request fails
// at once with ErrStopping; one already waiting when Stop began waits on,
// bounded by its timeout and Stop's deadline.
//
// Request returns:
//   - the response, when the consumer answered with Delivery.Respond;
//   - a *RequestFaultError when the consumer failed and the request was
//     dead-lettered (after its retries, at once for a permanent error);
//   - an error wrapping ErrRequestTimeout when no response came within the
//     timeout (WithRequestTimeout, default 30s), and ctx's error when ctx
//     ended first; a response that arrives later is dropped (debug log,
//     Stats.ResponsesDropped, barewire.responses.dropped{reason=late});
//   - an error wrapping ErrUnexpectedResponse when the response's message
//     type is not Resp's (Resp = Raw takes any response as it is).
func Request[Resp any](ctx context.Context, b *Bus, destination string, req any, opts ...RequestOption) (Resp, error) {
	var resp Resp
	msg, err := b.request(ctx, destination, req, opts)
	if err != nil {
		return resp, err
	}
	typ := msg.Metadata.Get(wire.HeaderMessageType)
	if raw, ok := any(&resp).(*Raw); ok {
		*raw = Raw{Type: typ, ContentType: msg.Metadata.Get(wire.HeaderContentType), Body: msg.Payload}
		return resp, nil
	}
	if want := endpoint.TypeNameOf[Resp](); typ != "" && want != "" && typ != want {
		return resp, fmt.Errorf("%w: the response to request %s is a %q, not a %q", ErrUnexpectedResponse, msg.Metadata.Get(wire.HeaderRequestID), typ, want)
	}
	if err := b.cfg.serializer.Unmarshal(msg.Payload, &resp); err != nil {
		return resp, fmt.Errorf("bus: decode the response %s to request %s: %w", typ, msg.Metadata.Get(wire.HeaderRequestID), err)
	}
	return resp, nil
}

// replies is the bus instance's reply queue, declared at the first
// request, and the requests waiting for a response.
type replies struct {
	mu     sync.Mutex
	ctx    context.Context // the bus's run context; the subscription lives as long
	closed bool            // Stop began: declare nothing more
	queue  string          // "" until declared
	// declaring is closed when the declaration in progress ends (nil
	// when none is).
	declaring chan struct{}
	done      chan struct{} // closed when the subscription ends
	pending   map[string]chan *message.Message
}

func (r *replies) start(ctx context.Context) {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
}

func (r *replies) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}

// replyQueue declares the instance's reply queue and starts consuming it,
// once. A failure (the broker down) is returned and tried again by the next
// request. The declaration talks to the broker without holding r.mu (the
// consumer's responses and Stop need it); requests that come meanwhile
// wait for it as long as their own contexts allow.
func (b *Bus) replyQueue(ctx context.Context) (string, <-chan struct{}, error) {
	rq, ok := b.tr.(transport.ReplyQueues)
	if !ok {
		return "", nil, ErrRequestUnsupported
	}
	r := &b.replies
	for {
		r.mu.Lock()
		if r.queue != "" {
			q, done := r.queue, r.done
			r.mu.Unlock()
			return q, done, nil
		}
		if r.closed || r.ctx == nil {
			r.mu.Unlock()
			return "", nil, ErrNotStarted
		}
		if wait := r.declaring; wait != nil {
			r.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return "", nil, fmt.Errorf("bus: wait for the reply queue: %w", ctx.Err())
			}
		}
		declaring := make(chan struct{})
		r.declaring = declaring
		runCtx := r.ctx
		r.mu.Unlock()
		q, done, err := b.declareReplyQueue(ctx, runCtx, rq)
		r.mu.Lock()
		r.declaring = nil
		r.mu.Unlock()
		close(declaring)
		return q, done, err
	}
}

// declareReplyQueue declares a reply queue, consumes it for as long as
// runCtx lives and records it in b.replies, unless Stop began meanwhile.
func (b *Bus) declareReplyQueue(ctx, runCtx context.Context, rq transport.ReplyQueues) (string, <-chan struct{}, error) {
	// The instance id names the queue for operators; the random part keeps
	// two buses given the same WithInstanceID apart.
	name := "bw.reply." + b.cfg.instanceID + "." + wire.NewID()[:8]
	if err := rq.DeclareReplyQueue(ctx, name); err != nil {
		return "", nil, fmt.Errorf("bus: declare the reply queue %q: %w", name, err)
	}
	ch, err := b.tr.Subscriber().Subscribe(runCtx, name)
	if err != nil {
		return "", nil, fmt.Errorf("bus: consume the reply queue %q: %w", name, err)
	}
	done := make(chan struct{})
	consume := func() {
		defer close(done)
		for msg := range ch {
			b.onResponse(msg)
		}
	}
	r := &b.replies
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue, r.done = name, done // Stop deletes it, if it has not looked yet
	if r.closed {
		// Stop began meanwhile and may be waiting for b.bg already: the
		// subscription ends with runCtx, which Stop cancels.
		go consume()
		return "", nil, ErrStopping
	}
	b.bg.Go(consume) // under r.mu, before Stop's Wait (r.closed)
	if r.pending == nil {
		r.pending = map[string]chan *message.Message{}
	}
	b.log.DebugContext(ctx, "reply queue declared", "queue", name)
	return name, done, nil
}

// deleteReplyQueue removes the reply queue at Stop.
func (b *Bus) deleteReplyQueue(ctx context.Context) {
	r := &b.replies
	r.mu.Lock()
	name := r.queue
	r.mu.Unlock()
	rq, ok := b.tr.(transport.ReplyQueues)
	if name == "" || !ok {
		return
	}
	if err := rq.DeleteReplyQueue(ctx, name); err != nil {
		b.log.WarnContext(ctx, "could not delete the reply queue; responses sent to it are dropped by the transport or wait there", "queue", name, "error", err)
	}
}

// onResponse hands a response to the request waiting for it, or drops it.
func (b *Bus) onResponse(msg *message.Message) {
	defer msg.Ack()
	id := msg.Metadata.Get(wire.HeaderRequestID)
	r := &b.replies
	r.mu.Lock()
	w := r.pending[id]
	delete(r.pending, id)
	r.mu.Unlock()
	if w != nil {
		w <- msg // buffered, and only one response is taken per request
		return
	}
	b.log.Debug("response dropped: no request waits for it (timed out, cancelled, or answered already)",
		"request_id", id, "message_id", msg.UUID, "message_type", msg.Metadata.Get(wire.HeaderMessageType))
	b.responseDropped(context.Background(), "late")
}

func (b *Bus) responseDropped(ctx context.Context, reason string) {
	b.ctr.responsesDropped.Add(1)
	b.tel.respDropped.Add(ctx, 1, metric.WithAttributes(attrReason.String(reason)))
}

func (b *Bus) request(ctx context.Context, destination string, req any, opts []RequestOption) (*message.Message, error) {
	cfg := requestConfig{timeout: DefaultRequestTimeout}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil request option", ErrInvalidOption)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if destination == "" {
		return nil, fmt.Errorf("%w: Request: empty destination", ErrInvalidMessage)
	}
	switch b.state.Load() {
	case stateStarted:
	case stateStopping:
		return nil, ErrStopping
	default:
		return nil, ErrNotStarted
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	queue, done, err := b.replyQueue(wctx)
	if err != nil {
		return nil, err
	}
	h := maps.Clone(cfg.headers)
	if h == nil {
		h = Headers{}
	}
	h[wire.HeaderResponseAddress] = wire.QueuePrefix + queue
	delete(h, wire.HeaderRequestID)
	m, scheduled, err := b.envelope(destination, req, h)
	if err != nil {
		return nil, err
	}
	if scheduled {
		return nil, fmt.Errorf("%w: a request cannot be scheduled (Delay, DeliverAt): its caller waits for the answer", ErrInvalidMessage)
	}
	if b.sqlite() && TxFromContext(ctx) != nil && b.consumesHere(m) {
		return nil, fmt.Errorf("bus: request %s to %s: %w", m.MessageType, destination, ErrRequestInTransaction)
	}
	w := make(chan *message.Message, 1)
	r := &b.replies
	r.mu.Lock()
	if _, dup := r.pending[m.MessageID]; dup {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: a request with message id %q is waiting already; give each request its own id", ErrInvalidMessage, m.MessageID)
	}
	r.pending[m.MessageID] = w
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.pending, m.MessageID)
		r.mu.Unlock()
	}()

	if err := b.sendRequest(wctx, m); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("bus: request %s to %s: %w", m.MessageID, destination, ctx.Err())
		}
		return nil, err
	}
	select {
	case resp := <-w:
		if resp.Metadata.Get(wire.HeaderMessageType) == FaultMessageType {
			return nil, faultOf(m.MessageID, resp)
		}
		return resp, nil
	case <-done:
		return nil, fmt.Errorf("bus: request %s to %s: stopped while waiting for the response: %w", m.MessageID, destination, ErrStopped)
	case <-wctx.Done():
		if ctx.Err() != nil {
			return nil, fmt.Errorf("bus: request %s to %s: %w", m.MessageID, destination, ctx.Err())
		}
		return nil, fmt.Errorf("%w: no response to %s %s from %s within %v (WithRequestTimeout)", ErrRequestTimeout, m.MessageType, m.MessageID, destination, cfg.timeout)
	}
}

// sqlite reports whether the bus's database is SQLite (one connection).
func (b *Bus) sqlite() bool {
	return b.db != nil && b.db.Dialector != nil && b.db.Dialector.Name() == gormstore.DialectSQLite
}

// consumesHere reports whether an endpoint of this bus would receive m: the
// queue it names, or a consumer of its type for a publish.
func (b *Bus) consumesHere(m *outbox.Message) bool {
	kind, name := wire.ParseDestination(m.Destination)
	for _, ep := range b.endpoints {
		if kind == "queue" && ep.Name() == name {
			return true
		}
		if kind != "queue" && slices.Contains(ep.MessageTypes(), m.MessageType) {
			return true
		}
	}
	return false
}

// sendRequest delivers the request straight to the transport, mandatory
// where the transport can tell that nobody received it.
func (b *Bus) sendRequest(ctx context.Context, m *outbox.Message) (err error) {
	ctx, endSpan := b.tel.startPublish(ctx, m, false)
	defer func() {
		endSpan(err, false)
		if err == nil {
			b.obs.published(ctx, m, false, false)
		}
	}()
	if md, ok := b.tr.(transport.MandatoryDeliverer); ok {
		err = md.DeliverMandatory(ctx, []*outbox.Message{m})[0]
	} else {
		err = b.tr.Deliver(ctx, []*outbox.Message{m})[0]
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, transport.ErrUnroutable):
		return fmt.Errorf("%w: %s %s to %s: nobody consumes it (declare a receive endpoint for it, or check the destination): %w", ErrNoConsumer, m.MessageType, m.MessageID, m.Destination, err)
	}
	return fmt.Errorf("bus: send request %s %s: %w", m.MessageType, m.MessageID, err)
}

func faultOf(requestID string, resp *message.Message) *RequestFaultError {
	attempts, _ := strconv.Atoi(resp.Metadata.Get(wire.HeaderFaultAttempts))
	return &RequestFaultError{
		RequestID: requestID,
		Endpoint:  resp.Metadata.Get(wire.HeaderFaultEndpoint),
		Type:      resp.Metadata.Get(wire.HeaderFaultType),
		Message:   resp.Metadata.Get(wire.HeaderFaultReason),
		Attempts:  attempts,
	}
}

// Respond writes a consumer's response (endpoint.Delivery.Respond) to the
// outbox in the consumer's transaction: it leaves only if the transaction
// commits. Never straight into a PostgreSQL transport's queue in that
// transaction: a requester gone (its reply queue deleted) would fail the
// consumer, while through the outbox the relay drops such a response.
func (p consumerPublisher) Respond(ctx context.Context, address string, msg any, headers endpoint.Headers) error {
	return p.b.respond(ctx, address, msg, headers)
}

func (b *Bus) respond(ctx context.Context, address string, msg any, headers Headers) (err error) {
	tx, ok := gormstore.TxFromContext(ctx)
	if !ok {
		err := b.Send(ctx, address, msg, headers)
		if errors.Is(err, transport.ErrUnroutable) || errors.Is(err, outbox.ErrUndeliverable) {
			b.log.InfoContext(ctx, "response dropped: the requester's reply queue is gone", "destination", address, "error", err)
			b.responseDropped(ctx, "unroutable")
			return nil
		}
		return err
	}
	m, scheduled, err := b.envelope(address, msg, headers)
	if err != nil {
		return err
	}
	if scheduled {
		return fmt.Errorf("%w: a response cannot be scheduled (Delay, DeliverAt): its requester waits for it", ErrInvalidMessage)
	}
	if st := stateFrom(ctx); st != nil {
		st.published.Store(true)
	}
	ctx, endSpan := b.tel.startPublish(ctx, m, true)
	defer func() {
		endSpan(err, false)
		if err == nil {
			b.obs.published(ctx, m, true, true)
		}
	}()
	if b.outboxSt == nil {
		return ErrNotStarted
	}
	if err := b.outboxSt.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{m}); err != nil {
		return fmt.Errorf("bus: write response to outbox: %w", err)
	}
	return nil
}

// answerFault tells the requester that its request was dead-lettered. It is
// sent directly, like the dead letter; when it cannot be (the requester is
// gone), it is dropped with a log: the dead letter keeps the request.
func (b *Bus) answerFault(ctx context.Context, ep *endpoint.Endpoint, msg *message.Message, dl *outbox.Message, log *slog.Logger) {
	addr := msg.Metadata.Get(wire.HeaderResponseAddress)
	if addr == "" {
		return
	}
	if !strings.HasPrefix(addr, wire.QueuePrefix) || len(addr) == len(wire.QueuePrefix) {
		log.DebugContext(ctx, "dead-lettered request has a response address that is no queue; no fault response", "message_id", quoteIfBad(msg.UUID), "response_address", addr)
		return
	}
	attempts, _ := strconv.Atoi(dl.Headers[wire.HeaderFaultAttempts])
	body, _ := json.Marshal(faultBody{
		RequestID: msg.UUID, Endpoint: ep.Name(), Type: dl.Headers[wire.HeaderFaultType],
		Message: dl.Headers[wire.HeaderFaultReason], Attempts: attempts,
	})
	f := &outbox.Message{
		MessageID:     wire.ResponseID(msg.UUID, ep.Name()),
		MessageType:   FaultMessageType,
		ContentType:   "application/json",
		CorrelationID: msg.Metadata.Get(wire.HeaderCorrelationID),
		Destination:   addr,
		Payload:       body,
		Headers: map[string]string{
			wire.HeaderRequestID:     msg.UUID,
			wire.HeaderFaultReason:   dl.Headers[wire.HeaderFaultReason],
			wire.HeaderFaultType:     dl.Headers[wire.HeaderFaultType],
			wire.HeaderFaultEndpoint: ep.Name(),
			wire.HeaderFaultAttempts: dl.Headers[wire.HeaderFaultAttempts],
		},
	}
	if wire.CheckCorrelationID(f.CorrelationID) != nil {
		f.CorrelationID = ""
	}
	if err := wire.Validate(f, wire.Edge); err != nil {
		log.InfoContext(ctx, "fault response dropped: it cannot be sent", "message_id", quoteIfBad(msg.UUID), "error", err)
		b.responseDropped(ctx, "unroutable")
		return
	}
	dctx, cancel := detach.From(ctx)
	defer cancel()
	if err := b.tr.Deliver(dctx, []*outbox.Message{f})[0]; err != nil {
		log.InfoContext(ctx, "fault response dropped: the requester's reply queue cannot be reached", "message_id", msg.UUID, "response_address", addr, "error", err)
		b.responseDropped(ctx, "unroutable")
	}
}

// responseDropper wraps the relay's transport: a response the transport
// refuses because its reply queue is gone (the requester stopped) ends as
// dropped, with a log and a metric, instead of being retried and parked.
type responseDropper struct {
	b    *Bus
	next outbox.Transport
}

func (d *responseDropper) Deliver(ctx context.Context, msgs []*outbox.Message) []error {
	errs := d.next.Deliver(ctx, msgs)
	for i, err := range errs {
		if err == nil || i >= len(msgs) || msgs[i].Headers[wire.HeaderRequestID] == "" {
			continue
		}
		if errors.Is(err, transport.ErrUnroutable) || errors.Is(err, outbox.ErrUndeliverable) {
			d.b.log.InfoContext(ctx, "response dropped: the requester's reply queue is gone", "message_id", msgs[i].MessageID,
				"request_id", msgs[i].Headers[wire.HeaderRequestID], "destination", msgs[i].Destination, "error", err)
			d.b.responseDropped(ctx, "unroutable")
			errs[i] = nil
		}
	}
	return errs
}
