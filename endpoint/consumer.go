package endpoint

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"

	"github.com/barewire-go/barewire/internal/plumb"
	"github.com/barewire-go/barewire/internal/wire"
)

// Headers are message headers: string keys and values.
type Headers map[string]string

// Publisher publishes further messages from inside a consumer. The bus
// supplies one that writes to the outbox in the consumer's transaction:
// the messages are sent if and only if the consumer's transaction commits.
type Publisher interface {
	// Publish fans msg out to every endpoint that consumes its type.
	Publish(ctx context.Context, msg any, headers Headers) error
	// Send delivers msg to one destination: "queue:name", "exchange:name",
	// or a bare endpoint name.
	Send(ctx context.Context, destination string, msg any, headers Headers) error
}

// Delivery is one message as a consumer receives it, with everything but the
// decoded body. Typed consumers get it embedded in Context[T].
type Delivery struct {
	// MessageID is the message's id (the inbox key).
	MessageID string
	// CorrelationID is the correlation id; messages published from the
	// consumer carry it on unless their headers set another, or it is one
	// a publish would refuse (over 255 bytes, a NUL byte, invalid UTF-8):
	// such a value is dropped, not inherited.
	CorrelationID string
	// MessageType is the BW-MessageType header.
	MessageType string
	ContentType string
	// Headers are all headers of the message.
	Headers Headers
	// Body is the raw body.
	Body []byte
	// Endpoint is the receiving endpoint's name.
	Endpoint string
	// Attempt counts in-process attempts, starting at 1.
	Attempt int

	publisher Publisher
}

// NewDelivery returns d bound to p for Publish and Send. Only the bus
// (and bustest) can call it: its first parameter is an internal type.
func NewDelivery(_ plumb.Token, d Delivery, p Publisher) *Delivery {
	d.publisher = p
	return &d
}

// Publish publishes msg in the consumer's transaction (see Publisher). Pass
// the ctx the consumer received: it carries the transaction.
func (d *Delivery) Publish(ctx context.Context, msg any, headers Headers) error {
	if d.publisher == nil {
		return fmt.Errorf("endpoint: this delivery cannot publish (not created by a bus)")
	}
	return d.publisher.Publish(ctx, msg, d.inherit(ctx, headers))
}

// Send sends msg to destination in the consumer's transaction.
func (d *Delivery) Send(ctx context.Context, destination string, msg any, headers Headers) error {
	if d.publisher == nil {
		return fmt.Errorf("endpoint: this delivery cannot send (not created by a bus)")
	}
	return d.publisher.Send(ctx, destination, msg, d.inherit(ctx, headers))
}

// ErrNotARequest is returned by Respond for a message that was not sent as a
// request (it carries no BW-ResponseAddress header).
var ErrNotARequest = errors.New("endpoint: the message is not a request (no BW-ResponseAddress header); only messages sent with bus.Request can be answered")

// responder is implemented by publishers that answer requests (the bus's).
type responder interface {
	Respond(ctx context.Context, address string, msg any, headers Headers) error
}

// Respond answers the request this delivery carries (one sent with
// bus.Request) with msg, in the consumer's transaction: the response is
// written to the outbox and leaves only if the consumer's transaction
// commits, like anything it publishes. Its message id is derived from the
// request's id and the endpoint's name, so that a response written twice
// is one message to the requester. Call it once per request; a request
// whose consumer fails is answered by the bus with a fault instead
// (bus.RequestFaultError on the caller's side) once it is dead-lettered.
// Respond returns ErrNotARequest for a message that is not a request.
func (d *Delivery) Respond(ctx context.Context, msg any) error {
	if d.publisher == nil {
		return fmt.Errorf("endpoint: this delivery cannot respond (not created by a bus)")
	}
	addr := d.Headers[wire.HeaderResponseAddress]
	if addr == "" {
		return ErrNotARequest
	}
	// The address comes from the wire: only a queue may be answered, so
	// that a crafted request cannot make the consumer publish anywhere.
	if !strings.HasPrefix(addr, wire.QueuePrefix) || len(addr) == len(wire.QueuePrefix) {
		return Permanent(fmt.Errorf("endpoint: request %q has response address %q; want %s<queue>", d.MessageID, addr, wire.QueuePrefix))
	}
	h := d.inherit(ctx, Headers{
		wire.HeaderRequestID: d.MessageID,
		wire.HeaderMessageID: wire.ResponseID(d.MessageID, d.Endpoint),
	})
	if r, ok := d.publisher.(responder); ok {
		return r.Respond(ctx, addr, msg, h)
	}
	return d.publisher.Send(ctx, addr, msg, h)
}

// canceller is implemented by publishers that cancel scheduled messages
// (the bus's).
type canceller interface {
	CancelScheduled(ctx context.Context, messageID string) (bool, error)
}

// CancelScheduled cancels the message with messageID (one published or sent
// with bus.Delay or bus.DeliverAt) if it has not left the outbox yet, in the
// consumer's transaction: the cancel takes effect only if the consumer's
// work commits; if it rolls back, the message stays scheduled. It reports
// whether a waiting message was deleted (see bus.Bus.CancelScheduled). Pass
// the ctx the consumer received: it carries the transaction.
func (d *Delivery) CancelScheduled(ctx context.Context, messageID string) (bool, error) {
	c, ok := d.publisher.(canceller)
	if !ok {
		return false, fmt.Errorf("endpoint: this delivery cannot cancel scheduled messages (not created by a bus)")
	}
	return c.CancelScheduled(ctx, messageID)
}

// correlationDropper is implemented by publishers that want to know when an
// incoming correlation id is not inherited (the bus logs it at debug level).
type correlationDropper interface {
	DroppedCorrelationID(ctx context.Context, d *Delivery, reason error)
}

func (d *Delivery) inherit(ctx context.Context, h Headers) Headers {
	if d.CorrelationID == "" {
		return h
	}
	if _, ok := h["correlation-id"]; ok {
		return h
	}
	// A value the publish would refuse must not make every follow-up
	// publish, and so the consumer, fail for a header it never chose.
	if err := wire.CheckCorrelationID(d.CorrelationID); err != nil {
		if cd, ok := d.publisher.(correlationDropper); ok {
			cd.DroppedCorrelationID(ctx, d, err)
		}
		return h
	}
	out := make(Headers, len(h)+1)
	for k, v := range h {
		out[k] = v
	}
	out["correlation-id"] = d.CorrelationID
	return out
}

// Context is what a typed consumer receives: the decoded message and its delivery.
type Context[T any] struct {
	*Delivery
	Message T
}

// Handler is a typed consumer implemented as a type (a struct with
// dependencies, say). Register it with ConsumerOf.
type Handler[T any] interface {
	Consume(ctx context.Context, c *Context[T]) error
}

// HandleFunc is the signature of a consumer function for messages of type T.
type HandleFunc[T any] func(ctx context.Context, c *Context[T]) error

// Consume lets a HandleFunc serve as a Handler.
func (f HandleFunc[T]) Consume(ctx context.Context, c *Context[T]) error { return f(ctx, c) }

// Registration is one consumer on an endpoint.
type Registration struct {
	// MessageType is the type name this consumer handles; empty for a raw
	// catch-all consumer.
	MessageType string
	// Types lists the message types of a raw consumer bound to types.
	Types []string
	// GoType is the message's Go type; nil for raw consumers.
	GoType reflect.Type
	// Name names the consumer in logs and errors.
	Name string
	// handle runs the consumer on a delivery.
	handle DeliveryFunc

	named bool // Name was given with Named
}

// DeliveryFunc runs a consumer on a delivery.
type DeliveryFunc func(ctx context.Context, d *Delivery) error

// Handle runs the consumer on d. Only the bus (and bustest) can call it:
// its first parameter is an internal type.
func (r *Registration) Handle(_ plumb.Token, ctx context.Context, d *Delivery) error {
	return r.handle(ctx, d)
}

// WrapHandle replaces the consumer's handler with wrap(handler), for
// bustest's recording. Only packages of this module can call it.
func (r *Registration) WrapHandle(_ plumb.Token, wrap func(next DeliveryFunc) DeliveryFunc) {
	r.handle = wrap(r.handle)
}

// ConsumerOption adjusts a consumer registration.
type ConsumerOption func(*Registration)

// Named names the consumer (defaults to its Go type or function name). Two
// consumers of one message type on one endpoint need distinct names.
func Named(name string) ConsumerOption {
	return func(r *Registration) { r.Name, r.named = name, true }
}

// AsMessageType overrides the message type name the consumer is dispatched
// on (defaults to TypeName of T).
func AsMessageType(name string) ConsumerOption {
	return func(r *Registration) { r.MessageType = name }
}

// ForTypes binds a raw consumer to the given message types instead of making
// it the endpoint's catch-all.
func ForTypes(types ...string) ConsumerOption {
	return func(r *Registration) { r.Types = append(r.Types, types...) }
}

// Consumer registers fn as the consumer of messages of type T on e.
func Consumer[T any](e *Endpoint, fn func(ctx context.Context, c *Context[T]) error, opts ...ConsumerOption) {
	if fn == nil {
		e.addErr(configErr("endpoint %q: Consumer[%s]: consumer function is nil", e.name, goTypeName[T]()))
		return
	}
	register[T](e, HandleFunc[T](fn), funcName(fn), opts)
}

// ConsumerOf registers h as the consumer of messages of type T on e.
func ConsumerOf[T any](e *Endpoint, h Handler[T], opts ...ConsumerOption) {
	if h == nil || (reflect.ValueOf(h).Kind() == reflect.Pointer && reflect.ValueOf(h).IsNil()) {
		e.addErr(configErr("endpoint %q: ConsumerOf[%s]: consumer is nil", e.name, goTypeName[T]()))
		return
	}
	register[T](e, h, reflect.TypeOf(h).String(), opts)
}

func register[T any](e *Endpoint, h Handler[T], name string, opts []ConsumerOption) {
	t := reflect.TypeFor[T]()
	r := &Registration{MessageType: TypeNameOf[T](), GoType: t, Name: name}
	for _, o := range opts {
		o(r)
	}
	if r.MessageType == "" {
		e.addErr(configErr("endpoint %q: consumer %q: message type name is empty", e.name, r.Name))
		return
	}
	r.handle = func(ctx context.Context, d *Delivery) error {
		var m T
		if err := e.Serializer.Unmarshal(d.Body, &m); err != nil {
			return Permanent(fmt.Errorf("cannot decode %s body: %w", r.MessageType, err))
		}
		return h.Consume(ctx, &Context[T]{Delivery: d, Message: m})
	}
	e.consumers = append(e.consumers, r)
}

// RawConsumer registers fn for raw deliveries (bytes and headers). Without
// ForTypes it is the endpoint's catch-all: it receives every message no typed
// consumer handles, including messages without a type.
func RawConsumer(e *Endpoint, fn func(ctx context.Context, d *Delivery) error, opts ...ConsumerOption) {
	if fn == nil {
		e.addErr(configErr("endpoint %q: RawConsumer: consumer function is nil", e.name))
		return
	}
	r := &Registration{Name: funcName(fn), handle: fn}
	for _, o := range opts {
		o(r)
	}
	if r.MessageType != "" {
		r.Types = append(r.Types, r.MessageType)
		r.MessageType = ""
	}
	if len(r.Types) == 0 {
		e.consumers = append(e.consumers, r)
		return
	}
	for _, typ := range r.Types {
		c := *r
		c.MessageType = typ
		c.Types = nil
		e.consumers = append(e.consumers, &c)
	}
}

// TypeNamer is implemented by message types that choose their wire name.
type TypeNamer interface{ MessageType() string }

// TypeNameOf returns the wire name of message type T: T's MessageType()
// when it implements TypeNamer, otherwise its Go type name without package.
func TypeNameOf[T any]() string {
	var zero T
	return TypeName(zero)
}

// TypeName returns the wire name of v's type (see TypeNameOf).
func TypeName(v any) string {
	if n, ok := v.(TypeNamer); ok {
		return n.MessageType()
	}
	t := reflect.TypeOf(v)
	if t == nil {
		return ""
	}
	if n, ok := reflect.New(t).Interface().(TypeNamer); ok && t.Kind() != reflect.Pointer {
		return n.MessageType()
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

func goTypeName[T any]() string { return reflect.TypeFor[T]().String() }

func funcName(fn any) string {
	f := runtime.FuncForPC(reflect.ValueOf(fn).Pointer())
	if f == nil {
		return "func"
	}
	n := f.Name()
	if i := strings.LastIndex(n, "/"); i >= 0 {
		n = n[i+1:]
	}
	return n
}
