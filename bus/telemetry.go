package bus

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
)

// instrumentationName names the tracer and the meter.
const instrumentationName = "github.com/barewire-go/barewire"

// statsMaxAge is how long outbox and inbox counts are reused by the
// observable gauges and the health check: a scrape or a probe never costs
// more than one count query per few seconds.
const statsMaxAge = 5 * time.Second

// Attribute keys of metrics (the same names as the log attributes).
const (
	attrEndpoint    = attribute.Key("endpoint")
	attrMessageType = attribute.Key("message_type")
	attrDestination = attribute.Key("destination")
	attrOutcome     = attribute.Key("outcome")
	attrTablePrefix = attribute.Key("table_prefix")
)

// Attribute keys of spans: OpenTelemetry's messaging semantic conventions,
// and barewire.* for what they do not cover.
const (
	attrMsgSystem       = attribute.Key("messaging.system")
	attrMsgDestination  = attribute.Key("messaging.destination.name")
	attrMsgID           = attribute.Key("messaging.message.id")
	attrMsgConversation = attribute.Key("messaging.message.conversation_id")
	attrMsgBodySize     = attribute.Key("messaging.message.body.size")
	attrMsgOpType       = attribute.Key("messaging.operation.type")
	attrMsgOpName       = attribute.Key("messaging.operation.name")
	attrMsgGroup        = attribute.Key("messaging.consumer.group.name")
	attrMsgBatchCount   = attribute.Key("messaging.batch.message_count")
	attrMsgRoutingKey   = attribute.Key("messaging.rabbitmq.destination.routing_key")
	attrBWMessageType   = attribute.Key("barewire.message_type")
	attrBWOutbox        = attribute.Key("barewire.outbox")
	attrBWOutboxID      = attribute.Key("barewire.outbox.id")
	attrBWAttempt       = attribute.Key("barewire.attempt")
	attrBWOutcome       = attribute.Key("barewire.outcome")
)

// durationBuckets are histogram boundaries in seconds, from a millisecond
// to ten minutes.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

type telemetryConfig struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	propagator     propagation.TextMapPropagator
	observers      []func(Event) // events.go
}

// WithTracerProvider sets where the bus's spans go: "<type> publish"
// (producer) when a message is published, "<type> send" (producer) when the
// relay hands an outbox row to the broker, and "<type> process" (consumer)
// around each delivery. Defaults to otel.GetTracerProvider(), a no-op until
// the application sets one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) error {
		if tp == nil {
			return optErr("WithTracerProvider: provider is nil")
		}
		c.telemetry.tracerProvider = tp
		return nil
	}
}

// WithMeterProvider sets where the bus's metrics go (barewire.messages.*,
// barewire.handler.duration, barewire.outbox.*, barewire.relay.lag,
// barewire.inbox.locks; see docs/observability.md). Defaults to
// otel.GetMeterProvider(), a no-op until the application sets one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return optErr("WithMeterProvider: provider is nil")
		}
		c.telemetry.meterProvider = mp
		return nil
	}
}

// WithPropagator sets how trace context is written into message headers
// at publish (and so into outbox rows) and read back at consume.
// propagation.TraceContext{} writes W3C traceparent and tracestate.
// Defaults to otel.GetTextMapPropagator(), which carries nothing until the
// application sets one (otel.SetTextMapPropagator).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) error {
		if p == nil {
			return optErr("WithPropagator: propagator is nil")
		}
		c.telemetry.propagator = p
		return nil
	}
}

// telemetry holds the bus's tracer, propagator and instruments.
type telemetry struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	meter  metric.Meter
	system string // messaging.system

	observers []func(Event) // events.go

	published, consumed, failed, retried, redelivered, deadLettered, duplicates metric.Int64Counter

	inFlight        metric.Int64UpDownCounter
	dbOutages       metric.Int64Counter
	dbPaused        metric.Int64UpDownCounter
	handlerDuration metric.Float64Histogram
	relayLag        metric.Float64Histogram

	outboxPending, outboxParked, inboxLocks metric.Int64ObservableGauge
	outboxOldest                            metric.Float64ObservableGauge

	mu  sync.Mutex
	reg metric.Registration

	outboxStats cached[outbox.Stats]
	inboxStats  cached[inbox.Stats]

	// inflight maps deliveries being handled to their observation, for
	// the inbox's OnDuplicate hook when its context carries none.
	inflightMu sync.Mutex
	inflight   map[inbox.Key]*observation
}

func newTelemetry(c telemetryConfig, system string) *telemetry {
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	if c.propagator == nil {
		c.propagator = otel.GetTextMapPropagator()
	}
	t := &telemetry{
		tracer:    c.tracerProvider.Tracer(instrumentationName),
		prop:      c.propagator,
		meter:     c.meterProvider.Meter(instrumentationName),
		system:    system,
		inflight:  map[inbox.Key]*observation{},
		observers: c.observers,
	}
	m := t.meter
	noop := metricnoop.Meter{}
	// An instrument the SDK refuses (it never should: the names are
	// fixed) is reported to otel's error handler and replaced by a no-op.
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{message}"))
		if err != nil {
			otel.Handle(err)
			c, _ = noop.Int64Counter(name)
		}
		return c
	}
	t.published = counter("barewire.messages.published", "Messages confirmed by the transport: published directly, relayed from the outbox, or written to the PostgreSQL transport in a transaction that committed.")
	t.consumed = counter("barewire.messages.consumed", "Deliveries whose consumers succeeded and committed.")
	t.failed = counter("barewire.messages.failed", "Consumer attempts that failed (each retry counts).")
	t.retried = counter("barewire.messages.retried", "Failed attempts retried in process.")
	t.redelivered = counter("barewire.messages.redelivered", "Messages handed back for a delayed redelivery.")
	t.deadLettered = counter("barewire.messages.dead_lettered", "Messages moved to a dead-letter destination.")
	t.duplicates = counter("barewire.messages.duplicates", "Deliveries the inbox skipped as already processed.")

	var err error
	if t.inFlight, err = m.Int64UpDownCounter("barewire.messages.in_flight",
		metric.WithDescription("Deliveries being handled now."), metric.WithUnit("{message}")); err != nil {
		otel.Handle(err)
		t.inFlight, _ = noop.Int64UpDownCounter("barewire.messages.in_flight")
	}
	if t.dbOutages, err = m.Int64Counter("barewire.database.outages",
		metric.WithDescription("Times consumption paused because the database stopped answering."), metric.WithUnit("{outage}")); err != nil {
		otel.Handle(err)
		t.dbOutages, _ = noop.Int64Counter("barewire.database.outages")
	}
	if t.dbPaused, err = m.Int64UpDownCounter("barewire.database.paused",
		metric.WithDescription("1 while consumption is paused for a database outage, else 0."), metric.WithUnit("{outage}")); err != nil {
		otel.Handle(err)
		t.dbPaused, _ = noop.Int64UpDownCounter("barewire.database.paused")
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		if err != nil {
			otel.Handle(err)
			h, _ = noop.Float64Histogram(name)
		}
		return h
	}
	t.handlerDuration = histogram("barewire.handler.duration", "Time to handle one delivery: inbox, consumers, retries and settling.")
	t.relayLag = histogram("barewire.relay.lag", "Time from an outbox row's creation to the broker's confirm of it.")

	gauge := func(name, desc, unit string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
		if err != nil {
			otel.Handle(err)
			g, _ = noop.Int64ObservableGauge(name)
		}
		return g
	}
	t.outboxPending = gauge("barewire.outbox.pending", "Outbox rows waiting for the relay.", "{message}")
	t.outboxParked = gauge("barewire.outbox.parked", "Outbox rows parked after MaxAttempts failed deliveries.", "{message}")
	t.inboxLocks = gauge("barewire.inbox.locks", "Inbox entries locked by a delivery in progress.", "{entry}")
	if t.outboxOldest, err = m.Float64ObservableGauge("barewire.outbox.oldest_pending_age",
		metric.WithDescription("Age of the oldest pending outbox row."), metric.WithUnit("s")); err != nil {
		otel.Handle(err)
		t.outboxOldest, _ = noop.Float64ObservableGauge("barewire.outbox.oldest_pending_age")
	}
	return t
}

// cached holds a value fetched at most once per maxAge.
type cached[T any] struct {
	mu sync.Mutex
	at time.Time
	v  T
}

// get returns the cached value when it is younger than maxAge, otherwise
// fetches it (one caller at a time). Failures are not cached.
func (c *cached[T]) get(ctx context.Context, maxAge time.Duration, fetch func(context.Context) (T, error)) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < maxAge {
		return c.v, nil
	}
	v, err := fetch(ctx)
	if err != nil {
		return v, err
	}
	c.v, c.at = v, time.Now()
	return v, nil
}

// cachedOutboxStats returns the outbox counts, at most statsMaxAge old.
func (b *Bus) cachedOutboxStats(ctx context.Context) (outbox.Stats, error) {
	return b.tel.outboxStats.get(ctx, statsMaxAge, func(ctx context.Context) (outbox.Stats, error) {
		if b.outboxSt == nil {
			return outbox.Stats{}, ErrNotStarted
		}
		return b.outboxSt.Stats(ctx)
	})
}

// startTelemetry registers the observable gauges; Start calls it once the
// stores are open.
func (b *Bus) startTelemetry() {
	b.startEvents()
	t := b.tel
	attrs := metric.WithAttributes(attrTablePrefix.String(b.cfg.outboxOpts.TablePrefix))
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var errs []error
		if st, err := b.cachedOutboxStats(ctx); err != nil {
			errs = append(errs, err)
		} else {
			o.ObserveInt64(t.outboxPending, st.Pending, attrs)
			o.ObserveInt64(t.outboxParked, st.Parked, attrs)
			age := 0.0
			if !st.OldestPending.IsZero() {
				age = max(time.Since(st.OldestPending).Seconds(), 0)
			}
			o.ObserveFloat64(t.outboxOldest, age, attrs)
		}
		st, err := t.inboxStats.get(ctx, statsMaxAge, func(ctx context.Context) (inbox.Stats, error) {
			return b.inboxSt.Stats(ctx)
		})
		if err != nil {
			errs = append(errs, err)
		} else {
			o.ObserveInt64(t.inboxLocks, st.Locked, attrs)
		}
		return errors.Join(errs...)
	}, t.outboxPending, t.outboxParked, t.outboxOldest, t.inboxLocks)
	if err != nil {
		otel.Handle(err)
		return
	}
	t.mu.Lock()
	t.reg = reg
	t.mu.Unlock()
}

// stopTelemetry unregisters the gauges; Stop calls it before closing the
// database.
func (b *Bus) stopTelemetry() {
	t := b.tel
	t.mu.Lock()
	reg := t.reg
	t.reg = nil
	t.mu.Unlock()
	if reg != nil {
		if err := reg.Unregister(); err != nil {
			otel.Handle(err)
		}
	}
}

// ---- publish ----

// startPublish starts the "<type> publish" span of m, writes its trace
// context into m's headers (so that it is stored in the outbox row and
// carried to every consumer) and returns the function that ends it.
//
// The returned function ends the span. direct says the message was written
// to the transport in the caller's transaction (the PostgreSQL transport,
// no outbox row): the span then says so, and the published counter moves
// when the transport sees the transaction commit (countCommitted).
func (b *Bus) startPublish(ctx context.Context, tx *gorm.DB, m *outbox.Message) (context.Context, func(err error, direct bool)) {
	t := b.tel
	viaOutbox := tx != nil || b.cfg.outboxOpts.PublishThroughOutbox
	if !viaOutbox {
		_, viaOutbox = gormstore.TxFromContext(ctx)
	}
	opType, opName := "send", "publish"
	if viaOutbox {
		opType = "create" // the relay sends it later
	}
	if kind, _ := wire.ParseDestination(m.Destination); kind == "queue" {
		opName = "send"
	}
	_, dest := wire.ParseDestination(m.Destination)
	attrs := []attribute.KeyValue{
		attrMsgSystem.String(t.system),
		attrMsgDestination.String(dest),
		attrMsgID.String(m.MessageID),
		attrMsgOpType.String(opType),
		attrMsgOpName.String(opName),
		attrMsgBodySize.Int(len(m.Payload)),
		attrBWMessageType.String(m.MessageType),
		attrBWOutbox.Bool(viaOutbox),
	}
	if m.CorrelationID != "" {
		attrs = append(attrs, attrMsgConversation.String(m.CorrelationID))
	}
	if m.RoutingKey != "" {
		attrs = append(attrs, attrMsgRoutingKey.String(m.RoutingKey))
	}
	ctx, span := t.tracer.Start(ctx, spanName(m.MessageType, dest, "publish"),
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	t.prop.Inject(ctx, propagation.MapCarrier(m.Headers))
	if len(m.Headers) == 0 {
		m.Headers = nil
	}
	return ctx, func(err error, direct bool) {
		if direct {
			span.SetAttributes(attrBWOutbox.Bool(false), attrMsgOpType.String("send"))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			t.emitPublished(ctx, m, viaOutbox && !direct, viaOutbox)
			if !viaOutbox {
				// Outbox rows count when the relay has them confirmed
				// (instrumentRelay): a rolled-back transaction publishes nothing.
				t.published.Add(ctx, 1, metric.WithAttributes(attrMessageType.String(m.MessageType), attrDestination.String(dest)))
			}
		}
		span.End()
	}
}

// countCommitted counts the messages the PostgreSQL transport wrote in
// transactions that have committed (publishing with no outbox row).
func (t *telemetry) countCommitted(msgs []*outbox.Message) {
	t.emitCommitted(msgs)
	for _, m := range msgs {
		_, dest := wire.ParseDestination(m.Destination)
		t.published.Add(context.Background(), 1, metric.WithAttributes(attrMessageType.String(m.MessageType), attrDestination.String(dest)))
	}
}

func spanName(messageType, fallback, op string) string {
	if messageType == "" {
		messageType = fallback
	}
	if messageType == "" {
		return op
	}
	return messageType + " " + op
}

// ---- relay ----

// instrumentRelay gives the relay a "<type> send" span per message and
// records barewire.relay.lag for every confirmed row.
func (b *Bus) instrumentRelay(r *outbox.Relay) {
	t := b.tel
	r.Transport = &tracedTransport{t: t, next: r.Transport}
	prev := r.OnDelivered
	r.OnDelivered = func(msgs []*outbox.Message) {
		if prev != nil {
			prev(msgs)
		}
		t.emitRelayed(msgs)
		now := time.Now()
		for _, m := range msgs {
			_, dest := wire.ParseDestination(m.Destination)
			attrs := metric.WithAttributes(attrMessageType.String(m.MessageType), attrDestination.String(dest))
			t.published.Add(context.Background(), 1, attrs)
			if !m.CreatedAt.IsZero() {
				t.relayLag.Record(context.Background(), max(now.Sub(m.CreatedAt).Seconds(), 0), attrs)
			}
		}
	}
}

// tracedTransport wraps the relay's transport with send spans, each a child
// of the publish span whose context the row's headers carry. The headers
// are not rewritten: consumers stay children of the publish span.
type tracedTransport struct {
	t    *telemetry
	next outbox.Transport
}

func (tt *tracedTransport) Deliver(ctx context.Context, msgs []*outbox.Message) []error {
	t := tt.t
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		_, dest := wire.ParseDestination(m.Destination)
		pctx := t.prop.Extract(ctx, propagation.MapCarrier(m.Headers))
		_, spans[i] = t.tracer.Start(pctx, spanName(m.MessageType, dest, "send"),
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attrMsgSystem.String(t.system),
				attrMsgDestination.String(dest),
				attrMsgID.String(m.MessageID),
				attrMsgOpType.String("send"),
				attrMsgOpName.String("send"),
				attrMsgBatchCount.Int(len(msgs)),
				attrBWMessageType.String(m.MessageType),
				attrBWOutboxID.Int64(m.ID),
				attrBWAttempt.Int(m.Attempts+1),
			))
	}
	errs := tt.next.Deliver(ctx, msgs)
	for i, span := range spans {
		if i < len(errs) && errs[i] != nil {
			span.RecordError(errs[i])
			span.SetStatus(codes.Error, errs[i].Error())
		}
		span.End()
	}
	return errs
}

// ---- consume ----

type observationKey struct{}

// observation is what one delivery's handling noted, for its span and
// metrics.
type observation struct {
	attrs    metric.MeasurementOption
	span     trace.Span
	attempts atomic.Int64
	outcome  atomic.Pointer[string]

	endpoint, messageID, messageType string // for events (events.go)
	lastErr                          atomic.Pointer[error]
	faultHeaders                     atomic.Pointer[map[string]string] // what deadLetter wrote
}

func (o *observation) setOutcome(s string) { o.outcome.Store(&s) }

// Outcomes of a delivery (the outcome attribute of barewire.handler.duration).
const (
	outcomeConsumed     = "consumed"
	outcomeDuplicate    = "duplicate"
	outcomeDeadLettered = "dead_lettered"
	outcomeRedelivery   = "redelivery_scheduled"
	outcomeRequeued     = "requeued"
	outcomeAcked        = "acked"
)

// event is something the handler notes about a delivery.
type event int

const (
	evConsumed event = iota
	evRetried
	evRedelivered
	evDeadLettered
)

// instrument wraps an endpoint's handler with the "<type> process" span
// (a child of the publish span found in the message's headers), the
// in-flight counter and the duration histogram. The consumer's context
// carries the span, so that what it publishes is part of the same trace.
func (b *Bus) instrument(ep *endpoint.Endpoint, next message.NoPublishHandlerFunc) message.NoPublishHandlerFunc {
	t := b.tel
	known := ep.MessageTypes()
	return func(msg *message.Message) error {
		typ := msg.Metadata.Get(wire.HeaderMessageType)
		metricType := typ
		if !slices.Contains(known, typ) {
			metricType = "_other" // bounds the attribute's values
		}
		attrs := []attribute.KeyValue{attrEndpoint.String(ep.Name()), attrMessageType.String(metricType)}
		dest := ep.Name()
		if d := msg.Metadata.Get(wire.HeaderDestination); d != "" {
			_, dest = wire.ParseDestination(d)
		}
		ctx := t.prop.Extract(msg.Context(), propagation.MapCarrier(msg.Metadata))
		ctx, span := t.tracer.Start(ctx, spanName(typ, ep.Name(), "process"),
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attrMsgSystem.String(t.system),
				attrMsgDestination.String(dest),
				attrMsgID.String(msg.UUID),
				attrMsgOpType.String("process"),
				attrMsgOpName.String("process"),
				attrMsgGroup.String(ep.Name()),
				attrMsgBodySize.Int(len(msg.Payload)),
				attrBWMessageType.String(typ),
			))
		if c := msg.Metadata.Get(wire.HeaderCorrelationID); c != "" {
			span.SetAttributes(attrMsgConversation.String(c))
		}
		o := &observation{attrs: metric.WithAttributes(attrs...), span: span,
			endpoint: ep.Name(), messageID: msg.UUID, messageType: typ}
		key := inbox.Key{MessageID: msg.UUID, ConsumerType: ep.Name()}
		if key.MessageID != "" {
			t.inflightMu.Lock()
			if _, taken := t.inflight[key]; !taken {
				t.inflight[key] = o
			} else {
				key.MessageID = "" // a concurrent delivery of the same id owns the entry
			}
			t.inflightMu.Unlock()
		}
		msg.SetContext(context.WithValue(ctx, observationKey{}, o))

		startAt := time.Now()
		t.inFlight.Add(ctx, 1, o.attrs)
		err := next(msg)
		t.inFlight.Add(ctx, -1, o.attrs)

		if key.MessageID != "" {
			t.inflightMu.Lock()
			delete(t.inflight, key)
			t.inflightMu.Unlock()
		}
		outcome := outcomeAcked
		if p := o.outcome.Load(); p != nil {
			outcome = *p
		}
		if err != nil {
			outcome = outcomeRequeued
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else if nacked(msg) {
			outcome = outcomeRequeued // handed back without an error (inbox busy, shutdown)
		}
		span.SetAttributes(attrBWOutcome.String(outcome))
		t.emitHandled(ep.Name(), typ, msg.UUID, msg.Metadata, msg.Payload, o, outcome)
		t.handlerDuration.Record(ctx, time.Since(startAt).Seconds(), metric.WithAttributes(append(attrs, attrOutcome.String(outcome))...))
		span.End()
		return err
	}
}

// nacked reports whether the handler handed msg back to the broker.
func nacked(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}

func observationFrom(ctx context.Context) *observation {
	o, _ := ctx.Value(observationKey{}).(*observation)
	return o
}

// note records an event of the delivery whose handling ctx belongs to.
func (t *telemetry) note(ctx context.Context, ev event) {
	o := observationFrom(ctx)
	if o == nil {
		return
	}
	switch ev {
	case evConsumed:
		o.setOutcome(outcomeConsumed)
		t.consumed.Add(ctx, 1, o.attrs)
	case evRetried:
		t.retried.Add(ctx, 1, o.attrs)
		o.span.AddEvent("retry")
		if len(t.observers) > 0 {
			ev := Event{Kind: EventRetried, Endpoint: o.endpoint, MessageID: o.messageID, MessageType: o.messageType, Attempt: int(o.attempts.Load())}
			if p := o.lastErr.Load(); p != nil {
				ev.Err = *p
			}
			t.emit(ev)
		}
	case evRedelivered:
		o.setOutcome(outcomeRedelivery)
		t.redelivered.Add(ctx, 1, o.attrs)
		o.span.AddEvent("delayed redelivery scheduled")
	case evDeadLettered:
		o.setOutcome(outcomeDeadLettered)
		t.deadLettered.Add(ctx, 1, o.attrs)
		o.span.SetStatus(codes.Error, "dead-lettered")
	}
}

// outage records the start (down) or end of a database outage.
func (t *telemetry) outage(ctx context.Context, down bool) {
	if down {
		t.dbOutages.Add(ctx, 1)
		t.dbPaused.Add(ctx, 1)
		return
	}
	t.dbPaused.Add(ctx, -1)
}

// attemptDone records a failed consumer attempt (an inbox lock held by
// another delivery is not a failure).
func (t *telemetry) attemptDone(ctx context.Context, attempt int, err error) {
	o := observationFrom(ctx)
	if o == nil {
		return
	}
	o.attempts.Store(int64(attempt))
	if err == nil || errors.Is(err, inbox.ErrBusy) {
		return
	}
	o.lastErr.Store(&err)
	t.failed.Add(ctx, 1, o.attrs)
	o.span.RecordError(err, trace.WithAttributes(attrBWAttempt.Int(attempt)))
}

// duplicate records a delivery the inbox skipped as already processed.
func (t *telemetry) duplicate(ctx context.Context, key inbox.Key) {
	// The delivery's own observation first: when two deliveries of one id
	// overlap (a redelivery after a lost connection), the map holds the
	// first one's, or none once it finished.
	o := observationFrom(ctx)
	if o == nil {
		t.inflightMu.Lock()
		o = t.inflight[key]
		t.inflightMu.Unlock()
	}
	if o == nil {
		t.duplicates.Add(context.Background(), 1, metric.WithAttributes(attrEndpoint.String(key.ConsumerType), attrMessageType.String("_other")))
		return
	}
	o.setOutcome(outcomeDuplicate)
	o.span.AddEvent("duplicate skipped")
	t.duplicates.Add(context.Background(), 1, o.attrs)
}

// ---- logs ----

// watermillHandler adapts Watermill's log records to the bus's attribute
// names (message_uuid → message_id, handler_name → handler) and demotes
// "Handler returned error": the handler's errors are nacks (inbox busy,
// shutdown) that the bus itself logs where they matter.
type watermillHandler struct{ next slog.Handler }

func (h watermillHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h watermillHandler) Handle(ctx context.Context, r slog.Record) error {
	level := r.Level
	if r.Message == "Handler returned error" && level > slog.LevelDebug {
		level = slog.LevelDebug
		if !h.next.Enabled(ctx, level) {
			return nil
		}
	}
	out := slog.NewRecord(r.Time, level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(renameWatermillAttr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h watermillHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	renamed := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		renamed[i] = renameWatermillAttr(a)
	}
	return watermillHandler{h.next.WithAttrs(renamed)}
}

func (h watermillHandler) WithGroup(name string) slog.Handler {
	return watermillHandler{h.next.WithGroup(name)}
}

func renameWatermillAttr(a slog.Attr) slog.Attr {
	switch a.Key {
	case "message_uuid":
		a.Key = "message_id"
	case "handler_name":
		a.Key = "handler"
	case "err":
		a.Key = "error"
	}
	return a
}
