package bus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

type TelemetryOrderPlaced struct {
	OrderID string `json:"orderId"`
}

type TelemetryOrderConfirmed struct {
	OrderID string `json:"orderId"`
}

type TelemetryPoison struct{}

func TestTelemetryTraceAcrossOutboxHop(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	confirmed := make(chan map[string]string, 1)
	b := start(t, quiet(), bus.WithTracerProvider(tp), bus.WithPropagator(propagation.TraceContext{}),
		inprocEndpoints(func(c *endpoint.Endpoints) {
			c.ReceiveEndpoint("tel-orders", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[TelemetryOrderPlaced]) error {
					return c.Publish(ctx, TelemetryOrderConfirmed{OrderID: c.Message.OrderID}, bus.Headers{bus.HeaderMessageID: "tel-confirm-1"})
				})
			})
			c.ReceiveEndpoint("tel-confirmations", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[TelemetryOrderConfirmed]) error {
					confirmed <- c.Headers
					return nil
				})
			})
		}))

	// The HTTP request's span, as an instrumented server would start it.
	ctx, root := tp.Tracer("test").Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	err := b.Transaction(ctx, func(tx *gorm.DB) error {
		return b.PublishTx(ctx, tx, TelemetryOrderPlaced{OrderID: "o-1"}, bus.Headers{bus.HeaderMessageID: "tel-order-1"})
	})
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	var headers map[string]string
	select {
	case headers = <-confirmed:
	case <-time.After(10 * time.Second):
		t.Fatal("the follow-up message was not consumed")
	}
	traceID := root.SpanContext().TraceID()
	if !strings.Contains(headers["traceparent"], traceID.String()) {
		t.Errorf("consumer's traceparent header %q does not carry the request's trace %s", headers["traceparent"], traceID)
	}

	spanNamed := func(name string) tracetest.SpanStub {
		t.Helper()
		var found []tracetest.SpanStub
		waitFor(t, func() bool {
			found = found[:0]
			for _, s := range exp.GetSpans() {
				if s.Name == name {
					found = append(found, s)
				}
			}
			return len(found) > 0
		})
		if len(found) != 1 {
			t.Fatalf("%d spans named %q; want 1", len(found), name)
		}
		return found[0]
	}
	placedPub := spanNamed("TelemetryOrderPlaced publish")
	placedSend := spanNamed("TelemetryOrderPlaced send")
	placedProc := spanNamed("TelemetryOrderPlaced process")
	confPub := spanNamed("TelemetryOrderConfirmed publish")
	confSend := spanNamed("TelemetryOrderConfirmed send")
	confProc := spanNamed("TelemetryOrderConfirmed process")

	for _, s := range []tracetest.SpanStub{placedPub, placedSend, placedProc, confPub, confSend, confProc} {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %q is in trace %s; want the request's trace %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
	}
	parent := func(child, want tracetest.SpanStub) {
		t.Helper()
		if child.Parent.SpanID() != want.SpanContext.SpanID() {
			t.Errorf("parent of %q is %s; want %q (%s)", child.Name, child.Parent.SpanID(), want.Name, want.SpanContext.SpanID())
		}
	}
	if placedPub.Parent.SpanID() != root.SpanContext().SpanID() {
		t.Errorf("publish span's parent is %s; want the request span %s", placedPub.Parent.SpanID(), root.SpanContext().SpanID())
	}
	parent(placedSend, placedPub)
	parent(placedProc, placedPub)
	parent(confPub, placedProc)
	parent(confSend, confPub)
	parent(confProc, confPub)

	kinds := map[string]trace.SpanKind{placedPub.Name: trace.SpanKindProducer, placedSend.Name: trace.SpanKindProducer, placedProc.Name: trace.SpanKindConsumer}
	for _, s := range []tracetest.SpanStub{placedPub, placedSend, placedProc} {
		if s.SpanKind != kinds[s.Name] {
			t.Errorf("span %q kind %v; want %v", s.Name, s.SpanKind, kinds[s.Name])
		}
	}
	wantAttrs := func(s tracetest.SpanStub, want map[string]string) {
		t.Helper()
		got := map[string]string{}
		for _, kv := range s.Attributes {
			got[string(kv.Key)] = kv.Value.String()
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("span %q: %s = %q; want %q (all: %v)", s.Name, k, got[k], v, got)
			}
		}
	}
	wantAttrs(placedPub, map[string]string{"messaging.system": "inproc", "messaging.destination.name": "TelemetryOrderPlaced",
		"messaging.message.id": "tel-order-1", "messaging.operation.type": "create", "barewire.outbox": "true"})
	wantAttrs(placedSend, map[string]string{"messaging.operation.type": "send", "messaging.message.id": "tel-order-1"})
	wantAttrs(placedProc, map[string]string{"messaging.system": "inproc", "messaging.message.id": "tel-order-1",
		"messaging.operation.type": "process", "messaging.consumer.group.name": "tel-orders", "barewire.outcome": "consumed"})
	wantAttrs(confProc, map[string]string{"messaging.consumer.group.name": "tel-confirmations", "messaging.message.id": "tel-confirm-1"})

	// The trace context travelled in the outbox row's headers.
	rows, err := b.OutboxStore().List(context.Background(), outbox.Query{})
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, r := range rows {
		if strings.Contains(r.Headers["traceparent"], traceID.String()) {
			stored++
		}
	}
	if stored != 2 {
		t.Errorf("%d of %d outbox rows carry the trace's traceparent; want 2", stored, len(rows))
	}
}

// metricSum adds up an Int64 sum's data points whose attributes include want.
func metricSum(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	total, found := metricTotal(t, rm, name, want...)
	if !found {
		t.Errorf("metric %s not reported", name)
	}
	return total
}

// metricTotal is metricSum for a poll: a metric not reported yet is 0.
func metricTotal(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) (int64, bool) {
	t.Helper()
	var total int64
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			found = true
			var points []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				points = d.DataPoints
			case metricdata.Gauge[int64]:
				points = d.DataPoints
			default:
				t.Fatalf("%s has data %T", name, m.Data)
			}
			for _, p := range points {
				if hasAttrs(p.Attributes, want) {
					total += p.Value
				}
			}
		}
	}
	return total, found
}

func hasAttrs(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// histogramCount counts a float64 histogram's observations.
func histogramCount(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) uint64 {
	t.Helper()
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				t.Fatalf("%s has data %T", name, m.Data)
			}
			for _, p := range h.DataPoints {
				if hasAttrs(p.Attributes, want) {
					n += p.Count
				}
			}
		}
	}
	return n
}

func TestTelemetryMetricsAfterWorkload(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	b := start(t, quiet(), bus.WithMeterProvider(mp), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("tel-m-orders", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[TelemetryOrderPlaced]) error { return nil })
		})
		c.ReceiveEndpoint("tel-m-poison", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[TelemetryPoison]) error {
				return errors.New("always fails")
			})
		})
	}))
	ctx := context.Background()
	const direct, viaOutbox = 5, 2
	id := func(i int) bus.Headers { return bus.Headers{bus.HeaderMessageID: "tel-m-" + string(rune('a'+i))} }
	for i := range direct {
		if err := b.Publish(ctx, TelemetryOrderPlaced{OrderID: "x"}, id(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		for i := direct; i < direct+viaOutbox; i++ {
			if err := b.PublishTx(ctx, tx, TelemetryOrderPlaced{OrderID: "x"}, id(i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed == direct+viaOutbox })
	for i := range 2 { // two re-publishes of processed ids
		if err := b.Publish(ctx, TelemetryOrderPlaced{OrderID: "x"}, id(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Publish(ctx, TelemetryPoison{}, bus.Headers{bus.HeaderMessageID: "tel-m-poison-1"}); err != nil {
		t.Fatal(err)
	}
	waitStats(t, b, func(s bus.Stats) bool { return s.Duplicates == 2 && s.DeadLettered == 1 })
	drain(t, b)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	orders := []attribute.KeyValue{attribute.String("endpoint", "tel-m-orders"), attribute.String("message_type", "TelemetryOrderPlaced")}
	poison := []attribute.KeyValue{attribute.String("endpoint", "tel-m-poison"), attribute.String("message_type", "TelemetryPoison")}
	checks := []struct {
		name string
		got  int64
		want int64
	}{
		{"published (5 direct + 2 relayed + 2 repeats + 1 poison)", metricSum(t, rm, "barewire.messages.published"), direct + viaOutbox + 2 + 1},
		{"published relayed", metricSum(t, rm, "barewire.messages.published", attribute.String("message_type", "TelemetryOrderPlaced")), direct + viaOutbox + 2},
		{"consumed", metricSum(t, rm, "barewire.messages.consumed", orders...), direct + viaOutbox},
		{"duplicates", metricSum(t, rm, "barewire.messages.duplicates", orders...), 2},
		{"dead_lettered", metricSum(t, rm, "barewire.messages.dead_lettered", poison...), 1},
		{"failed (2 attempts of the poison message)", metricSum(t, rm, "barewire.messages.failed", poison...), 2},
		{"retried", metricSum(t, rm, "barewire.messages.retried", poison...), 1},
		{"in_flight", metricSum(t, rm, "barewire.messages.in_flight"), 0},
		{"handler.duration consumed", int64(histogramCount(t, rm, "barewire.handler.duration", append(orders, attribute.String("outcome", "consumed"))...)), direct + viaOutbox},
		{"handler.duration duplicate", int64(histogramCount(t, rm, "barewire.handler.duration", append(orders, attribute.String("outcome", "duplicate"))...)), 2},
		{"handler.duration dead_lettered", int64(histogramCount(t, rm, "barewire.handler.duration", append(poison, attribute.String("outcome", "dead_lettered"))...)), 1},
		{"relay.lag", int64(histogramCount(t, rm, "barewire.relay.lag")), viaOutbox},
		{"outbox.pending", metricSum(t, rm, "barewire.outbox.pending", attribute.String("table_prefix", "barewire_")), 0},
		{"outbox.parked", metricSum(t, rm, "barewire.outbox.parked"), 0},
		{"inbox.locks", metricSum(t, rm, "barewire.inbox.locks"), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d; want %d", c.name, c.got, c.want)
		}
	}
	if s := b.Stats(); s.Consumed != direct+viaOutbox || s.Duplicates != 2 {
		t.Errorf("bus stats %+v disagree with the workload", s)
	}
}

func TestTelemetryOptionsRejectNil(t *testing.T) {
	t.Parallel()
	_, err := bus.New(bus.WithTracerProvider(nil), bus.WithMeterProvider(nil), bus.WithPropagator(nil), bus.WithHealthThresholds(-time.Second, 0))
	if !errors.Is(err, bus.ErrInvalidOption) {
		t.Fatalf("err = %v; want ErrInvalidOption", err)
	}
	for _, name := range []string{"WithTracerProvider", "WithMeterProvider", "WithPropagator", "WithHealthThresholds"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestTelemetryLogsUseSnakeCaseAttributes(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.Level(-12)}))
	b := start(t, bus.WithLogger(log), inprocEndpoint("tel-logs", func(e *endpoint.Endpoint) {
		e.Retry = endpoint.NoRetry()
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[TelemetryPoison]) error { return errors.New("boom") })
	}))
	if err := b.Publish(context.Background(), TelemetryPoison{}, bus.Headers{bus.HeaderMessageID: "tel-log-1"}); err != nil {
		t.Fatal(err)
	}
	waitStats(t, b, func(s bus.Stats) bool { return s.DeadLettered == 1 })
	out := buf.String()
	for _, bad := range []string{`"message_uuid"`, `"handler_name"`, `"messageId"`} {
		if strings.Contains(out, bad) {
			t.Errorf("log output has attribute %s; want snake_case names such as message_id", bad)
		}
	}
	if !strings.Contains(out, `"message_id":"tel-log-1"`) || !strings.Contains(out, `"endpoint":"tel-logs"`) {
		t.Errorf("dead-letter log lacks message_id/endpoint:\n%s", out)
	}
}

// healthJSON serves path from h and decodes the report.
func healthJSON(t *testing.T, h http.Handler, path string) (int, bus.HealthReport) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var rep bus.HealthReport
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatalf("%s: %v in %q", path, err, rec.Body.String())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	return rec.Code, rep
}

func checkStatus(rep bus.HealthReport, name string) string {
	for _, c := range rep.Checks {
		if c.Name == name {
			return c.Status
		}
	}
	return "missing"
}

func TestHealthRelayStalledReportsWhichCheck(t *testing.T) {
	t.Parallel()
	b := start(t, quiet(), bus.WithHealthThresholds(50*time.Millisecond, 1), inprocEndpoint("tel-health", func(e *endpoint.Endpoint) {
		endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[TelemetryOrderPlaced]) error { return nil })
	}))
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", b.HealthHandler()))
	ctx := context.Background()
	// Two rows for a queue nobody declared: the relay fails them and they
	// stay pending (retried with backoff).
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		for range 2 {
			if err := b.SendTx(ctx, tx, "queue:tel-nowhere", TelemetryOrderPlaced{}, nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // older than the 50ms threshold
	code, rep := healthJSON(t, mux, "/ops/health/ready")
	if code != http.StatusServiceUnavailable || rep.Status != "unhealthy" {
		t.Fatalf("ready = %d %+v; want 503 unhealthy", code, rep)
	}
	for name, want := range map[string]string{"bus": "pass", "transport": "pass", "database": "pass", "relay": "fail"} {
		if got := checkStatus(rep, name); got != want {
			t.Errorf("check %s = %s; want %s (%+v)", name, got, want, rep.Checks)
		}
	}
	for _, c := range rep.Checks {
		if c.Name == "relay" && (!strings.Contains(c.Error, "oldest pending") || !strings.Contains(c.Error, "2 outbox rows pending")) {
			t.Errorf("relay check error %q; want both thresholds named", c.Error)
		}
	}
	if err := b.Health(ctx); err == nil || !strings.HasPrefix(err.Error(), "relay: ") {
		t.Errorf("Health = %v; want a relay error", err)
	}
	if code, _ := healthJSON(t, mux, "/ops/health"); code != http.StatusServiceUnavailable {
		t.Errorf("/health = %d; want 503", code)
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ops/health/live", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("live = %d; want 200 whatever the relay does", rec.Code)
	}
}

func TestHealthNotStarted(t *testing.T) {
	t.Parallel()
	b, err := bus.New(quiet())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Health(context.Background()); !errors.Is(err, bus.ErrNotStarted) {
		t.Errorf("Health before Start = %v; want ErrNotStarted", err)
	}
	code, rep := healthJSON(t, b.HealthHandler(), "/health/ready")
	if code != http.StatusServiceUnavailable || checkStatus(rep, "bus") != "fail" {
		t.Errorf("ready before Start = %d %+v", code, rep)
	}
}

// tcpProxy forwards connections to target until closed; closing it cuts
// every connection it carries, as a broker going away would.
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
	closed atomic.Bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed.Load() {
			p.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			return
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(out, in)
		go pipe(in, out)
	}
}

func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting and cuts every connection.
func (p *tcpProxy) Close() {
	if p.closed.Swap(true) {
		return
	}
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func TestHealthUnreadyWhenBrokerConnectionLost(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newTCPProxy(t, u.Host)
	u.Host = proxy.Addr()
	b := start(t, quiet(), bus.WithTransport(rabbitmq.New(u.String(), nil)))
	h := b.HealthHandler()

	code, rep := healthJSON(t, h, "/health/ready")
	if code != http.StatusOK || rep.Status != "healthy" {
		t.Fatalf("ready while connected = %d %+v", code, rep)
	}
	proxy.Close() // the broker goes away; the shared RabbitMQ keeps running
	waitFor(t, func() bool { return b.Health(context.Background()) != nil })
	code, rep = healthJSON(t, h, "/health/ready")
	if code != http.StatusServiceUnavailable || rep.Status != "unhealthy" {
		t.Fatalf("ready after the connection was cut = %d %+v; want 503", code, rep)
	}
	t.Logf("report after the connection was cut: %s", mustJSON(t, rep))
	for name, want := range map[string]string{"transport": "fail", "database": "pass", "relay": "pass"} {
		if got := checkStatus(rep, name); got != want {
			t.Errorf("check %s = %s; want %s (%+v)", name, got, want, rep.Checks)
		}
	}
	if err := b.Health(context.Background()); !strings.HasPrefix(err.Error(), "transport: ") {
		t.Errorf("Health = %v; want a transport error", err)
	}
	if strings.Contains(mustJSON(t, rep), "guest:guest") {
		t.Errorf("health report leaks broker credentials: %s", mustJSON(t, rep))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health/live", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("live = %d; want 200 while the process serves HTTP", rec.Code)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

type (
	AgreeOrder  struct{ N int }
	AgreeFlaky  struct{}
	AgreePoison struct{}
	AgreeLater  struct{}
)

// TestStatsAndMetricsCountEachEventOnce drives every kind of delivery
// outcome and publish, then checks that Stats, the OpenTelemetry metrics
// and the events an observer got say the same, and what the workload did:
// each event is counted once, by everyone.
func TestStatsAndMetricsCountEachEventOnce(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	var mu sync.Mutex
	handled := map[string]int64{} // EventHandled by outcome
	var retriedEvents, publishedEvents int64
	observe := func(ev bus.Event) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case ev.Kind == bus.EventHandled:
			handled[ev.Outcome]++
		case ev.Kind == bus.EventRetried:
			retriedEvents++
		case ev.Kind == bus.EventPublished && !ev.InTx, ev.Kind == bus.EventRelayed:
			publishedEvents++ // what barewire.messages.published counts
		}
	}
	b := start(t, quiet(), bus.WithMeterProvider(mp), bus.WithObserver(observe),
		bus.WithOutbox(func(o *outbox.Options) { o.PollingInterval = 50 * time.Millisecond }),
		bus.WithTransport(inproc.New(func(c *inproc.Config) {
			c.ReceiveEndpoint("tel-agree-orders", func(e *endpoint.Endpoint) {
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[AgreeOrder]) error { return nil })
			})
			// Fails its first attempt after publishing (rolled back), then
			// publishes again and commits.
			c.ReceiveEndpoint("tel-agree-flaky", func(e *endpoint.Endpoint) {
				e.Retry = endpoint.Immediate(1)
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[AgreeFlaky]) error {
					if err := c.Publish(ctx, AgreeOrder{}, bus.Headers{bus.HeaderMessageID: "from-" + c.MessageID}); err != nil {
						return err
					}
					if c.Attempt == 1 {
						return errors.New("transient")
					}
					return nil
				})
			})
			c.ReceiveEndpoint("tel-agree-poison", func(e *endpoint.Endpoint) {
				e.Retry = endpoint.Immediate(2)
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[AgreePoison]) error { return errors.New("poison") })
			})
			// One delayed redelivery (an outbox row the relay publishes),
			// then the dead letter.
			c.ReceiveEndpoint("tel-agree-later", func(e *endpoint.Endpoint) {
				e.Retry = endpoint.NoRetry()
				e.Redelivery = []time.Duration{time.Millisecond}
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[AgreeLater]) error { return errors.New("not yet") })
			})
		})))
	ctx := context.Background()
	publish := func(msg any, id string) {
		t.Helper()
		if err := b.Publish(ctx, msg, bus.Headers{bus.HeaderMessageID: id}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		publish(AgreeOrder{N: i}, fmt.Sprintf("o-%d", i))
	}
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		for _, id := range []string{"o-4", "o-5"} {
			if err := b.PublishTx(ctx, tx, AgreeOrder{}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("roll back")
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := b.PublishTx(ctx, tx, AgreeOrder{}, bus.Headers{bus.HeaderMessageID: "o-rolled-back"}); err != nil {
			return err
		}
		return rollback
	}); !errors.Is(err, rollback) {
		t.Fatalf("transaction: %v", err)
	}
	for i := range 3 {
		publish(AgreeFlaky{}, fmt.Sprintf("f-%d", i))
	}
	publish(AgreePoison{}, "p-0")
	publish(AgreePoison{}, "p-1")
	publish(AgreeLater{}, "l-0")
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed == 12 && s.DeadLettered == 3 })
	publish(AgreeOrder{}, "o-0") // processed already
	publish(AgreeOrder{}, "o-1")
	waitStats(t, b, func(s bus.Stats) bool { return s.Duplicates == 2 })
	// A delivery whose context ends before it reaches a verdict (the bus
	// stopping under it) is handed back to the broker.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	msg := message.NewMessage("o-requeued", []byte(`{}`))
	msg.Metadata.Set(bus.HeaderMessageType, endpoint.TypeNameOf[AgreeOrder]())
	msg.SetContext(gone)
	if err := bus.HandleForTest(b, "tel-agree-orders", msg); err != nil {
		t.Fatal(err)
	}
	drain(t, b)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	s := b.Stats()
	outcome := func(o string) int64 {
		return int64(histogramCount(t, rm, "barewire.handler.duration", attribute.String("outcome", o)))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range []struct {
		name                string
		stats, metric, want int64
		events              int64
	}{
		// 6 orders published, 3 published by the flaky consumer's
		// committed attempts, and the 3 flaky messages.
		{"consumed", s.Consumed, metricSum(t, rm, "barewire.messages.consumed"), 12, handled[bus.OutcomeCommitted]},
		{"duplicates", s.Duplicates, metricSum(t, rm, "barewire.messages.duplicates"), 2, handled[bus.OutcomeDuplicate]},
		// 1 per flaky message, 2 per poison message.
		{"retries", s.Retries, metricSum(t, rm, "barewire.messages.retried"), 7, retriedEvents},
		{"redelivered", s.Redelivered, metricSum(t, rm, "barewire.messages.redelivered"), 1, handled[bus.OutcomeRedelivery]},
		{"dead-lettered", s.DeadLettered, metricSum(t, rm, "barewire.messages.dead_lettered"), 3, handled[bus.OutcomeDeadLettered]},
		{"requeued", s.Requeued, outcome(bus.OutcomeRequeued), 1, handled[bus.OutcomeRequeued]},
		{"in flight", s.InFlight, metricSum(t, rm, "barewire.messages.in_flight"), 0, 0},
	} {
		if c.stats != c.want || c.metric != c.want || c.events != c.want {
			t.Errorf("%s: Stats %d, metric %d, events %d; want %d", c.name, c.stats, c.metric, c.events, c.want)
		}
	}
	for _, c := range []struct {
		outcome string
		stats   int64
	}{{bus.OutcomeCommitted, s.Consumed}, {bus.OutcomeDuplicate, s.Duplicates}, {bus.OutcomeRedelivery, s.Redelivered},
		{bus.OutcomeDeadLettered, s.DeadLettered}, {bus.OutcomeAcked, 0}} {
		if got := outcome(c.outcome); got != c.stats {
			t.Errorf("handler.duration with outcome %s: %d; Stats say %d", c.outcome, got, c.stats)
		}
	}
	if n := int64(histogramCount(t, rm, "barewire.handler.duration")); n != 12+2+1+3+1 {
		t.Errorf("handler.duration counts %d deliveries; want 19", n)
	}
	// Metrics without a Stats field: every failed attempt (3 flaky, 3 per
	// poison message, 2 of the redelivered one), and every message the
	// transport took: 12 published directly, the 2 rows of the committed
	// transaction, the 3 the flaky consumer committed, and the
	// redelivery's row; nothing of the rolled-back transaction.
	if got := metricSum(t, rm, "barewire.messages.failed"); got != 11 {
		t.Errorf("failed = %d; want 11", got)
	}
	if got := metricSum(t, rm, "barewire.messages.published"); got != 18 || publishedEvents != 18 {
		t.Errorf("published: metric %d, events %d; want 18", got, publishedEvents)
	}
	if got := int64(histogramCount(t, rm, "barewire.relay.lag")); got != 6 {
		t.Errorf("relay.lag counts %d rows; want 6", got)
	}
	orders := []attribute.KeyValue{attribute.String("endpoint", "tel-agree-orders"), attribute.String("message_type", endpoint.TypeNameOf[AgreeOrder]())}
	if got := metricSum(t, rm, "barewire.messages.consumed", orders...); got != 9 {
		t.Errorf("consumed on tel-agree-orders = %d; want 9", got)
	}
}
