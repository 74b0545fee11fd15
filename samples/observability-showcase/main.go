// Command observability-showcase shows one trace following an order from
// the HTTP request through the outbox, the relay and two consumers, the
// bus's metrics on a Prometheus /metrics endpoint, log lines carrying the
// trace id, per-check health and the read-only admin API.
//
// POST /orders starts a server span, writes OrderPlaced to the outbox in a
// transaction (bus.PublishTx) and answers with the order id and trace id.
// The relay sends it; order-processing consumes it and publishes
// OrderConfirmed from its own transaction; notifications consumes that.
// GET /traces lists the recorded spans by trace (kept in memory). On the
// PostgreSQL transport both publishes write to the queue table in their
// transaction, with no outbox row and no relay (and so no send span).
//
//	go run ./samples/observability-showcase -demo   # scripted run, prints and exits
//	go run ./samples/observability-showcase         # HTTP API on 127.0.0.1:8090
//
// Add -amqp-url and -postgres-dsn to run on RabbitMQ and PostgreSQL, or
// -transport postgres with -postgres-dsn to run on the PostgreSQL transport
// (no broker; see README.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/admin"
	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

// OrderPlaced is published by POST /orders through the outbox.
type OrderPlaced struct {
	OrderID string  `json:"orderId"`
	Amount  float64 `json:"amount"`
}

// OrderConfirmed is published by the order-processing consumer.
type OrderConfirmed struct {
	OrderID string `json:"orderId"`
}

// telemetry is the application's OpenTelemetry setup: spans kept in memory
// for GET /traces, metrics exported to a Prometheus registry.
type telemetry struct {
	tp       *sdktrace.TracerProvider
	mp       *sdkmetric.MeterProvider
	spans    *spanStore
	registry *prometheus.Registry
}

func newTelemetry() (*telemetry, error) {
	// snippet:start telemetry-setup
	spans := &spanStore{max: 5000} // a sdktrace.SpanExporter; use OTLP in production
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	// snippet:end telemetry-setup
	return &telemetry{tp: tp, mp: mp, spans: spans, registry: registry}, nil
}

func (t *telemetry) shutdown(ctx context.Context) error {
	return errors.Join(t.tp.Shutdown(ctx), t.mp.Shutdown(ctx))
}

// busOptions wires the bus to the telemetry; the bus takes no exporter of
// its own, only the OpenTelemetry API.
func (t *telemetry) busOptions(logger *slog.Logger) []bus.Option {
	// snippet:start bus-options
	return []bus.Option{
		bus.WithTracerProvider(t.tp),
		bus.WithMeterProvider(t.mp),
		bus.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		bus.WithLogger(logger),
		bus.WithHealthThresholds(time.Minute, 10_000),
	}
	// snippet:end bus-options
}

type app struct {
	b      *bus.Bus
	tel    *telemetry
	tracer trace.Tracer
	log    *slog.Logger

	mu        sync.Mutex
	confirmed map[string]string // order id → trace id seen by notifications
}

func (a *app) declare(c *endpoint.Endpoints) {
	c.ReceiveEndpoint("order-processing", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
			// ctx carries the "OrderPlaced process" span: this log line
			// and the publish below are part of the order's trace.
			a.log.InfoContext(ctx, "order accepted", "order_id", c.Message.OrderID, "message_id", c.MessageID)
			return c.Publish(ctx, OrderConfirmed{OrderID: c.Message.OrderID}, bus.Headers{bus.HeaderMessageID: "confirm-" + c.Message.OrderID})
		})
	})
	c.ReceiveEndpoint("notifications", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderConfirmed]) error {
			a.log.InfoContext(ctx, "confirmation sent", "order_id", c.Message.OrderID)
			a.mu.Lock()
			a.confirmed[c.Message.OrderID] = trace.SpanContextFromContext(ctx).TraceID().String()
			a.mu.Unlock()
			return nil
		})
	})
}

// placeOrder is what POST /orders does, under a server span as an HTTP
// instrumentation (otelhttp) would start it.
func (a *app) placeOrder(ctx context.Context, amount float64) (orderID, traceID string, err error) {
	ctx, span := a.tracer.Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", "POST"), attribute.String("http.route", "/orders")))
	defer span.End()
	orderID = uuid.NewString()[:8]
	err = a.b.Transaction(ctx, func(tx *gorm.DB) error {
		// The business write would go here, in tx; the message commits with it.
		return a.b.PublishTx(ctx, tx, OrderPlaced{OrderID: orderID, Amount: amount}, bus.Headers{bus.HeaderMessageID: "order-" + orderID})
	})
	if err != nil {
		span.RecordError(err)
		return "", "", err
	}
	a.log.InfoContext(ctx, "order placed", "order_id", orderID)
	return orderID, span.SpanContext().TraceID().String(), nil
}

func main() {
	f := sample.ParseFlags("127.0.0.1:8090")
	tel, err := newTelemetry()
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tel.shutdown(context.Background()) }()
	level := slog.LevelInfo
	if f.Demo {
		level = slog.LevelWarn
	}
	logger := slog.New(traceLogHandler{slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})})
	a := &app{tel: tel, tracer: tel.tp.Tracer("observability-showcase"), log: logger, confirmed: map[string]string{}}
	b, err := f.NewBus(a.declare, nil, tel.busOptions(logger)...)
	if err != nil {
		log.Fatal(err)
	}
	a.b = b
	if err := f.Run(b, a.routes(), func(ctx context.Context) error { return a.demo(ctx, f) }, 0); err != nil {
		log.Fatal(err)
	}
}

func (a *app) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Amount float64 `json:"amount"`
		}
		if err := sample.ReadJSON(w, r, &req); err != nil {
			sample.WriteError(w, http.StatusBadRequest, err)
			return
		}
		id, traceID, err := a.placeOrder(r.Context(), req.Amount)
		if err != nil {
			sample.WriteError(w, http.StatusServiceUnavailable, err)
			return
		}
		sample.WriteJSON(w, http.StatusAccepted, map[string]string{"orderId": id, "traceId": traceID, "trace": "/traces?traceId=" + traceID})
	})
	mux.HandleFunc("GET /traces", func(w http.ResponseWriter, r *http.Request) {
		sample.WriteJSON(w, http.StatusOK, a.tel.spans.traces(r.URL.Query().Get("traceId")))
	})
	// snippet:start routes
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.tel.registry, promhttp.HandlerOpts{}))
	mux.Handle("/admin/", http.StripPrefix("/admin", admin.Handler(a.b))) // read-only
	// (sample.Serve mounts b.HealthHandler() on /health, /health/live and /health/ready.)
	// snippet:end routes
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) { sample.WriteJSON(w, http.StatusOK, a.b.Stats()) })
	return mux
}

// demo places an order, waits for its confirmation, and prints its trace,
// the bus's metrics and the health report.
func (a *app) demo(ctx context.Context, f sample.Flags) error {
	fmt.Printf("observability-showcase on %s\n\n", f.Transport())
	orderID, traceID, err := a.placeOrder(ctx, 42)
	if err != nil {
		return err
	}
	fmt.Printf("POST /orders → order %s, trace %s\n\n", orderID, traceID)
	if err := sample.WaitUntil(ctx, "the order's confirmation", func() (bool, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, ok := a.confirmed[orderID]
		return ok, nil
	}); err != nil {
		return err
	}
	// The last span ends when the notifications consumer's delivery is settled.
	want := []string{"POST /orders", "OrderPlaced publish", "OrderPlaced send", "OrderPlaced process",
		"OrderConfirmed publish", "OrderConfirmed send", "OrderConfirmed process"}
	// On the PostgreSQL transport a message published in a transaction is
	// written to its queue in that transaction: no outbox row, no relay,
	// so no send span.
	relayHop := !f.Is(sample.TransportPostgres)
	if !relayHop {
		want = slices.DeleteFunc(want, func(name string) bool { return strings.HasSuffix(name, " send") })
	}
	var spans []spanJSON
	if err := sample.WaitUntil(ctx, "the trace's spans", func() (bool, error) {
		ts := a.tel.spans.traces(traceID)
		if len(ts) == 1 {
			spans = ts[0].Spans
		}
		return len(spans) >= len(want), nil
	}); err != nil {
		return err
	}
	fmt.Printf("trace %s:\n", traceID)
	printTree(spans)

	rec := httptest.NewRecorder()
	a.routes().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	metrics := rec.Body.String()
	fmt.Println("\nGET /metrics (barewire_*, without histogram buckets):")
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "barewire_") && !strings.Contains(line, "_bucket{") {
			fmt.Println("  " + line)
		}
	}
	rep := a.b.CheckHealth(ctx)
	fmt.Printf("\nhealth: %s\n", rep.Status)
	for _, c := range rep.Checks {
		fmt.Printf("  %-9s %s %s\n", c.Name, c.Status, c.Error)
	}
	fmt.Println()

	byName := map[string]spanJSON{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	parentOf := func(child, parent string) bool {
		c, okc := byName[child]
		p, okp := byName[parent]
		return okc && okp && c.ParentSpanID == p.SpanID
	}
	var c sample.Checks
	for _, name := range want {
		_, ok := byName[name]
		c.Expect(ok, "span %q is in the order's trace", name)
	}
	c.Expect(parentOf("OrderPlaced publish", "POST /orders"), "the publish span is a child of the HTTP request's span")
	if relayHop {
		c.Expect(parentOf("OrderPlaced send", "OrderPlaced publish"), "the relay's send span is a child of the publish span")
		c.Expect(parentOf("OrderPlaced process", "OrderPlaced publish"), "the consumer's process span is a child of the publish span (across the outbox)")
	} else {
		c.Expect(parentOf("OrderPlaced process", "OrderPlaced publish"), "the consumer's process span is a child of the publish span (across the queue table)")
	}
	c.Expect(parentOf("OrderConfirmed publish", "OrderPlaced process"), "the follow-up publish is a child of the process span")
	c.Expect(parentOf("OrderConfirmed process", "OrderConfirmed publish"), "the second consumer's span is a child of the follow-up publish")
	a.mu.Lock()
	c.Expect(a.confirmed[orderID] == traceID, "the last consumer ran in the request's trace")
	a.mu.Unlock()
	c.Expect(strings.Contains(metrics, `barewire_messages_consumed_total{endpoint="order-processing",message_type="OrderPlaced"`),
		"/metrics has barewire_messages_consumed_total for order-processing")
	if relayHop {
		c.Expect(strings.Contains(metrics, "barewire_relay_lag_seconds_count"), "/metrics has the relay lag histogram")
	}
	c.Expect(strings.Contains(metrics, "barewire_outbox_pending"), "/metrics has the outbox gauges")
	c.Expect(rep.Status == "healthy", "health is %q", rep.Status)
	return c.Err()
}

// printTree prints spans indented under their parents.
func printTree(spans []spanJSON) {
	children := map[string][]spanJSON{}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	var roots []spanJSON
	for _, s := range spans {
		if ids[s.ParentSpanID] {
			children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
		} else {
			roots = append(roots, s)
		}
	}
	var walk func(s spanJSON, depth int)
	walk = func(s spanJSON, depth int) {
		fmt.Printf("  %s%-*s %-9s %s\n", strings.Repeat("  ", depth), 32-2*depth, s.Name, s.Kind, s.Attributes["messaging.consumer.group.name"])
		for _, c := range children[s.SpanID] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
}

// ---- span store ----

// spanStore is a span exporter that keeps the last max spans in memory.
type spanStore struct {
	mu    sync.Mutex
	max   int
	spans []sdktrace.ReadOnlySpan
}

func (s *spanStore) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spans = append(s.spans, spans...)
	if over := len(s.spans) - s.max; over > 0 {
		s.spans = slices.Delete(s.spans, 0, over)
	}
	return nil
}

func (s *spanStore) Shutdown(context.Context) error { return nil }

type spanJSON struct {
	Name         string            `json:"name"`
	Kind         string            `json:"kind"`
	SpanID       string            `json:"spanId"`
	ParentSpanID string            `json:"parentSpanId,omitempty"`
	Start        time.Time         `json:"start"`
	DurationMS   float64           `json:"durationMs"`
	Status       string            `json:"status,omitempty"`
	Attributes   map[string]string `json:"attributes,omitempty"`
}

type traceJSON struct {
	TraceID string     `json:"traceId"`
	Spans   []spanJSON `json:"spans"`
}

// traces groups the stored spans by trace, newest trace first; with id
// set, only that trace.
func (s *spanStore) traces(id string) []traceJSON {
	s.mu.Lock()
	spans := slices.Clone(s.spans)
	s.mu.Unlock()
	byTrace := map[string]*traceJSON{}
	var order []string
	for _, sp := range spans {
		tid := sp.SpanContext().TraceID().String()
		if id != "" && tid != id {
			continue
		}
		t := byTrace[tid]
		if t == nil {
			t = &traceJSON{TraceID: tid}
			byTrace[tid] = t
			order = append(order, tid)
		}
		js := spanJSON{
			Name: sp.Name(), Kind: sp.SpanKind().String(), SpanID: sp.SpanContext().SpanID().String(),
			Start: sp.StartTime().UTC(), DurationMS: float64(sp.EndTime().Sub(sp.StartTime()).Microseconds()) / 1000,
			Attributes: map[string]string{},
		}
		if sp.Parent().IsValid() {
			js.ParentSpanID = sp.Parent().SpanID().String()
		}
		if sp.Status().Code != 0 {
			js.Status = sp.Status().Code.String() + ": " + sp.Status().Description
		}
		for _, kv := range sp.Attributes() {
			js.Attributes[string(kv.Key)] = kv.Value.String()
		}
		t.Spans = append(t.Spans, js)
	}
	out := make([]traceJSON, 0, len(order))
	for i := len(order) - 1; i >= 0; i-- {
		t := byTrace[order[i]]
		sort.SliceStable(t.Spans, func(a, b int) bool { return t.Spans[a].Start.Before(t.Spans[b].Start) })
		out = append(out, *t)
	}
	return out
}

// ---- logs ----

// snippet:start trace-log-handler
// traceLogHandler adds trace_id and span_id to every record logged with a
// context that carries a span, so that logs and traces join up.
type traceLogHandler struct{ slog.Handler }

func (h traceLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceLogHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceLogHandler) WithGroup(name string) slog.Handler {
	return traceLogHandler{h.Handler.WithGroup(name)}
}

// snippet:end trace-log-handler
