package bus

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

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
	attrFallback    = attribute.Key("fallback")
	attrTablePrefix = attribute.Key("table_prefix")
	attrReason      = attribute.Key("reason")
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

// batchBuckets are the boundaries of barewire.consumer.batch.size, up to
// endpoint.MaxBatchMessages.
var batchBuckets = []float64{1, 2, 4, 8, 16, 32, 64}

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

// telemetry holds the bus's tracer, propagator and instruments; it is
// the OpenTelemetry observer of the bus's events (observe.go).
type telemetry struct {
	nopObserver
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	meter  metric.Meter
	system string // messaging.system

	// barewire.messages.*
	msgPublished, msgConsumed, msgFailed, msgRetried, msgRedelivered, msgDeadLettered, msgDuplicates metric.Int64Counter

	// barewire.responses.dropped (request.go)
	respDropped metric.Int64Counter
	// barewire.messages.dead_letter_fallbacks, by fallback
	msgDeadLetterFallbacks metric.Int64Counter

	msgInFlight     metric.Int64UpDownCounter
	dbOutages       metric.Int64Counter
	dbPaused        metric.Int64UpDownCounter
	handlerDuration metric.Float64Histogram
	relayLag        metric.Float64Histogram
	batchSize       metric.Int64Histogram

	outboxPending, outboxParked, inboxLocks metric.Int64ObservableGauge
	outboxOldest                            metric.Float64ObservableGauge

	mu  sync.Mutex
	reg metric.Registration

	outboxStats cached[outbox.Stats]
	inboxStats  cached[inbox.Stats]

	// attrMu guards attrCache: the metric attributes of deliveries by
	// endpoint and message type ("_other" for unknown types), built once
	// per pair since an attribute set costs allocations per use.
	attrMu    sync.RWMutex
	attrCache map[string]map[string]*deliveryAttrs
	// epAttrs are the record options of the endpoint attribute alone, by
	// endpoint (barewire.consumer.batch.size).
	epAttrs sync.Map
}

// deliveryAttrs are the metric attributes of deliveries of one message
// type on one endpoint, and their measurement options (without and with
// each outcome seen so far). Read-only once built, but for byOutcome.
type deliveryAttrs struct {
	attrs []attribute.KeyValue
	// add is the counters' option list, built once: a variadic call with
	// a fresh option would allocate the list on every Add.
	add []metric.AddOption

	mu        sync.RWMutex
	byOutcome map[string][]metric.RecordOption
}

// attrsFor returns the cached attributes of endpoint and metricType.
func (t *telemetry) attrsFor(endpoint, metricType string) *deliveryAttrs {
	t.attrMu.RLock()
	a := t.attrCache[endpoint][metricType]
	t.attrMu.RUnlock()
	if a != nil {
		return a
	}
	t.attrMu.Lock()
	defer t.attrMu.Unlock()
	if a := t.attrCache[endpoint][metricType]; a != nil {
		return a
	}
	attrs := []attribute.KeyValue{attrEndpoint.String(endpoint), attrMessageType.String(metricType)}
	a = &deliveryAttrs{attrs: attrs, add: []metric.AddOption{metric.WithAttributes(attrs...)}, byOutcome: map[string][]metric.RecordOption{}}
	if t.attrCache == nil {
		t.attrCache = map[string]map[string]*deliveryAttrs{}
	}
	if t.attrCache[endpoint] == nil {
		t.attrCache[endpoint] = map[string]*deliveryAttrs{}
	}
	t.attrCache[endpoint][metricType] = a
	return a
}

// withOutcome returns the record options of the attributes plus outcome
// (one of the bus's few Outcome* values).
func (a *deliveryAttrs) withOutcome(outcome string) []metric.RecordOption {
	a.mu.RLock()
	m := a.byOutcome[outcome]
	a.mu.RUnlock()
	if m != nil {
		return m
	}
	m = []metric.RecordOption{metric.WithAttributes(a.attrs[0], a.attrs[1], attrOutcome.String(outcome))}
	a.mu.Lock()
	a.byOutcome[outcome] = m
	a.mu.Unlock()
	return m
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
		tracer: c.tracerProvider.Tracer(instrumentationName),
		prop:   c.propagator,
		meter:  c.meterProvider.Meter(instrumentationName),
		system: system,
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
	t.msgPublished = counter("barewire.messages.published", "Messages confirmed by the transport: published directly, relayed from the outbox, or written to the PostgreSQL transport in a transaction that committed.")
	t.msgConsumed = counter("barewire.messages.consumed", "Deliveries whose consumers succeeded and committed.")
	t.msgFailed = counter("barewire.messages.failed", "Consumer attempts that failed (each retry counts).")
	t.msgRetried = counter("barewire.messages.retried", "Failed attempts retried in process.")
	t.msgRedelivered = counter("barewire.messages.redelivered", "Messages handed back for a delayed redelivery.")
	t.msgDeadLettered = counter("barewire.messages.dead_lettered", "Messages moved to a dead-letter destination.")
	t.msgDeadLetterFallbacks = counter("barewire.messages.dead_letter_fallbacks", "Dead letters the transport refused as they were: sent without the received message's headers (fallback=reduced) or, refused even so, written to the outbox (fallback=outbox).")
	t.msgDuplicates = counter("barewire.messages.duplicates", "Deliveries the inbox skipped as already processed.")
	t.respDropped = counter("barewire.responses.dropped", "Responses dropped: reason=late (the request had timed out or was cancelled) or reason=unroutable (the requester's reply queue is gone).")

	var err error
	if t.msgInFlight, err = m.Int64UpDownCounter("barewire.messages.in_flight",
		metric.WithDescription("Deliveries being handled now."), metric.WithUnit("{message}")); err != nil {
		otel.Handle(err)
		t.msgInFlight, _ = noop.Int64UpDownCounter("barewire.messages.in_flight")
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
	if t.batchSize, err = m.Int64Histogram("barewire.consumer.batch.size",
		metric.WithDescription("Messages a group-commit worker settled through one transaction (1: the per-message path)."),
		metric.WithUnit("{message}"), metric.WithExplicitBucketBoundaries(batchBuckets...)); err != nil {
		otel.Handle(err)
		t.batchSize, _ = noop.Int64Histogram("barewire.consumer.batch.size")
	}

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
	mu     sync.Mutex
	at     time.Time
	v      T
	flight *fetchFlight[T] // the fetch in progress, if any
}

type fetchFlight[T any] struct {
	done chan struct{}
	v    T
	err  error
}

// statsFetchTimeout bounds one fetch of a cached value, whoever asked.
const statsFetchTimeout = 5 * time.Second

// get returns the cached value when it is younger than maxAge, otherwise
// the result of one fetch shared by every caller meanwhile. Each caller
// waits only as long as its own ctx allows; the fetch itself is bounded by
// statsFetchTimeout, not by the ctx of whoever started it. Failures are
// not cached.
func (c *cached[T]) get(ctx context.Context, maxAge time.Duration, fetch func(context.Context) (T, error)) (T, error) {
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < maxAge {
		v := c.v
		c.mu.Unlock()
		return v, nil
	}
	f := c.flight
	if f == nil {
		f = &fetchFlight[T]{done: make(chan struct{})}
		c.flight = f
		go func() {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statsFetchTimeout)
			v, err := fetch(fctx)
			cancel()
			c.mu.Lock()
			f.v, f.err = v, err
			if err == nil {
				c.v, c.at = v, time.Now()
			}
			c.flight = nil
			c.mu.Unlock()
			close(f.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.v, f.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
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

// startTelemetry connects the embedded transport's settle signal and
// registers the observable gauges; Start calls it once the stores are open.
func (b *Bus) startTelemetry() {
	if b.mem != nil {
		b.mem.OnSettle(b.obs.settled)
	}
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
// viaOutbox says m is written in a transaction; the returned function's
// direct that it went to the transport in that transaction (the PostgreSQL
// transport, no outbox row).
func (t *telemetry) startPublish(ctx context.Context, m *outbox.Message, viaOutbox bool) (context.Context, func(err error, direct bool)) {
	opType, opName := "send", "publish"
	if viaOutbox {
		opType = "create" // the relay sends it later
	}
	kind, dest := wire.ParseDestination(m.Destination)
	if kind == "queue" {
		opName = "send"
	}
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
		}
		span.End()
	}
}

// published counts a message the transport confirmed at publish; one
// written in a transaction counts when it is delivered: a rolled-back
// transaction publishes nothing.
func (t *telemetry) published(ctx context.Context, m *outbox.Message, _, inTx bool) {
	if !inTx {
		t.msgPublished.Add(ctx, 1, publishAttrs(m))
	}
}

// delivered counts relayed outbox rows (and their relay lag) and messages
// the PostgreSQL transport saw commit.
func (t *telemetry) delivered(msgs []*outbox.Message, viaOutbox bool) {
	now := time.Now()
	for _, m := range msgs {
		attrs := publishAttrs(m)
		t.msgPublished.Add(context.Background(), 1, attrs)
		if viaOutbox && !m.CreatedAt.IsZero() {
			t.relayLag.Record(context.Background(), max(now.Sub(m.CreatedAt).Seconds(), 0), attrs)
		}
	}
}

func publishAttrs(m *outbox.Message) metric.MeasurementOption {
	_, dest := wire.ParseDestination(m.Destination)
	return metric.WithAttributes(attrMessageType.String(m.MessageType), attrDestination.String(dest))
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
// reports the rows it had confirmed.
func (b *Bus) instrumentRelay(r *outbox.Relay) {
	r.Transport = &tracedTransport{t: b.tel, next: r.Transport}
	prev := r.OnDelivered
	r.OnDelivered = func(msgs []*outbox.Message) {
		if prev != nil {
			prev(msgs)
		}
		b.obs.delivered(msgs, true)
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

// started begins the delivery's "<type> process" span (a child of the
// publish span found in the message's headers) and counts it in flight.
// The delivery's context carries the span, so that what its consumers
// publish is part of the same trace.
func (t *telemetry) started(ctx context.Context, d *delivery) context.Context {
	metricType := d.messageType
	if !d.knownType {
		metricType = "_other" // bounds the attribute's values
	}
	d.attrs = t.attrsFor(d.endpoint, metricType)
	md := d.msg.Metadata
	dest := d.endpoint
	if h := md.Get(wire.HeaderDestination); h != "" {
		_, dest = wire.ParseDestination(h)
	}
	ctx = t.prop.Extract(ctx, propagation.MapCarrier(md))
	ctx, d.span = t.tracer.Start(ctx, spanName(d.messageType, d.endpoint, "process"),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attrMsgSystem.String(t.system),
			attrMsgDestination.String(dest),
			attrMsgID.String(d.msg.UUID),
			attrMsgOpType.String("process"),
			attrMsgOpName.String("process"),
			attrMsgGroup.String(d.endpoint),
			attrMsgBodySize.Int(len(d.msg.Payload)),
			attrBWMessageType.String(d.messageType),
		))
	if c := md.Get(wire.HeaderCorrelationID); c != "" {
		d.span.SetAttributes(attrMsgConversation.String(c))
	}
	t.msgInFlight.Add(ctx, 1, d.attrs.add...)
	return ctx
}

func (t *telemetry) attemptFailed(ctx context.Context, d *delivery) {
	t.msgFailed.Add(ctx, 1, d.attrs.add...)
	d.span.RecordError(d.lastErr, trace.WithAttributes(attrBWAttempt.Int(int(d.attempt.Load()))))
}

func (t *telemetry) retried(ctx context.Context, d *delivery) {
	t.msgRetried.Add(ctx, 1, d.attrs.add...)
	d.span.AddEvent("retry")
}

// handled counts the delivery's outcome, records its duration and ends its
// span.
func (t *telemetry) handled(ctx context.Context, d *delivery) {
	switch d.outcome {
	case OutcomeCommitted:
		t.msgConsumed.Add(ctx, 1, d.attrs.add...)
	case OutcomeDuplicate:
		t.msgDuplicates.Add(ctx, 1, d.attrs.add...)
		d.span.AddEvent("duplicate skipped")
	case OutcomeRedelivery:
		t.msgRedelivered.Add(ctx, 1, d.attrs.add...)
		d.span.AddEvent("delayed redelivery scheduled")
	case OutcomeDeadLettered:
		t.msgDeadLettered.Add(ctx, 1, d.attrs.add...)
		d.span.SetStatus(codes.Error, "dead-lettered")
		if d.deadLetterForm != deadLetterFull {
			t.msgDeadLetterFallbacks.Add(ctx, 1, metric.WithAttributes(d.attrs.attrs[0], d.attrs.attrs[1], attrFallback.String(d.deadLetterForm)))
			d.span.AddEvent("dead letter fallback", trace.WithAttributes(attrFallback.String(d.deadLetterForm)))
		}
	}
	t.msgInFlight.Add(ctx, -1, d.attrs.add...)
	t.handlerDuration.Record(ctx, time.Since(d.start).Seconds(),
		d.attrs.withOutcome(d.outcome)...)
	d.span.SetAttributes(attrBWOutcome.String(d.outcome))
	d.span.End()
}

// batched records the size of a group-commit transaction.
func (t *telemetry) batched(endpoint string, n int) {
	opts, ok := t.epAttrs.Load(endpoint)
	if !ok {
		opts, _ = t.epAttrs.LoadOrStore(endpoint, []metric.RecordOption{metric.WithAttributes(attrEndpoint.String(endpoint))})
	}
	t.batchSize.Record(context.Background(), int64(n), opts.([]metric.RecordOption)...)
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
