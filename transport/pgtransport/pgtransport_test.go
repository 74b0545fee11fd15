package pgtransport_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/pgtransport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one test's database handle and table prefix; its tables are
// dropped and its pool closed when the test ends.
type env struct {
	db     *gorm.DB
	prefix string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dsn := testenv.PostgresDSN(t)
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{db: db, prefix: "pt_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_"}
	t.Cleanup(func() {
		for _, s := range []string{"queue_messages", "queues", "bindings"} {
			db.Exec(`DROP TABLE IF EXISTS ` + e.prefix + s)
		}
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return e
}

// syncBuffer collects log output from several goroutines.
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

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("BAREWIRE_TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start builds and starts a transport on e's tables with eps declared.
func (e *env) start(t *testing.T, cfg pgtransport.Config, log *slog.Logger, eps ...*endpoint.Endpoint) *pgtransport.Transport {
	t.Helper()
	cfg.TablePrefix = e.prefix
	if log == nil {
		log = testLogger(t)
	}
	tr, err := pgtransport.Open(e.db, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Start(ctx, eps); err != nil {
		t.Fatal(err)
	}
	return tr
}

// endpoints declares raw endpoints: name → message types bound to it.
func endpoints(t *testing.T, decl map[string][]string) []*endpoint.Endpoint {
	t.Helper()
	var c endpoint.Endpoints
	for name, types := range decl {
		c.ReceiveEndpoint(name, func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil }, endpoint.ForTypes(types...))
		})
	}
	if err := errors.Join(c.Errs()...); err != nil {
		t.Fatal(err)
	}
	return c.List()
}

func deliver(t *testing.T, tr *pgtransport.Transport, msgs ...*outbox.Message) {
	t.Helper()
	for i, err := range tr.Deliver(context.Background(), msgs) {
		if err != nil {
			t.Fatalf("deliver %s: %v", msgs[i].MessageID, err)
		}
	}
}

func msg(id, dest string) *outbox.Message {
	return &outbox.Message{MessageID: id, Destination: dest, MessageType: "T", Payload: []byte(id)}
}

func subscribe(t *testing.T, tr *pgtransport.Transport, ctx context.Context, queue string) <-chan *message.Message {
	t.Helper()
	ch, err := tr.Subscriber().Subscribe(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func recv(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("subscription closed")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10s")
	}
	return nil
}

func queueLen(t *testing.T, tr *pgtransport.Transport, q string) int {
	t.Helper()
	n, err := tr.Len(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPostgresRoundTripKeepsBytesIDsAndHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := e.start(t, pgtransport.Config{PollInterval: 10 * time.Second}, nil, endpoints(t, map[string][]string{"orders": {"OrderPlaced"}})...)
	ch := subscribe(t, tr, t.Context(), "orders")

	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = byte(i) // NUL, invalid UTF-8, everything
	}
	id := "order:" + strings.Repeat("x", 150) // ids are opaque strings, not UUIDs
	start := time.Now()
	deliver(t, tr, &outbox.Message{
		MessageID: id, Destination: "exchange:OrderPlaced", MessageType: "OrderPlaced",
		ContentType: "application/octet-stream", CorrelationID: "corr-1", Payload: payload,
		Headers: map[string]string{"traceparent": "00-abc-01", "note": "héllo\u0000wörld"},
	})
	m := recv(t, ch)
	// PollInterval is 10s: only the NOTIFY can have woken the consumer.
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("delivery took %v; the NOTIFY wake-up did not work", d)
	}
	if m.UUID != id || !bytes.Equal(m.Payload, payload) {
		t.Fatalf("got id %q payload %x", m.UUID, m.Payload)
	}
	want := map[string]string{
		wire.HeaderMessageID: id, wire.HeaderMessageType: "OrderPlaced", wire.HeaderContentType: "application/octet-stream",
		wire.HeaderCorrelationID: "corr-1", wire.HeaderDestination: "exchange:OrderPlaced", "traceparent": "00-abc-01",
		"note": "héllo\u0000wörld", transport.MetaRedelivered: "false", transport.MetaDeliveryCount: "0",
	}
	for k, v := range want {
		if got := m.Metadata.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	m.Ack()
	eventually(t, "acked row deleted", func() bool { return queueLen(t, tr, "orders") == 0 })
}

func TestPostgresFanOutAcrossProcessesAndSendRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Two "processes" consume the type on their own endpoints; a third only
	// publishes and knows nothing about either.
	a := e.start(t, pgtransport.Config{}, nil, endpoints(t, map[string][]string{"billing": {"OrderPlaced"}})...)
	b := e.start(t, pgtransport.Config{}, nil, endpoints(t, map[string][]string{"shipping": {"OrderPlaced", "OrderCancelled"}})...)
	pub := e.start(t, pgtransport.Config{}, nil)

	deliver(t, pub, msg("o1", "exchange:OrderPlaced"), msg("c1", "exchange:OrderCancelled"), msg("s1", "queue:billing"), msg("e1", "queue:billing_error"))
	if n := queueLen(t, a, "billing"); n != 2 {
		t.Errorf("billing holds %d rows, want 2 (o1, s1)", n)
	}
	if n := queueLen(t, b, "shipping"); n != 2 {
		t.Errorf("shipping holds %d rows, want 2 (o1, c1)", n)
	}
	if n := queueLen(t, a, "billing_error"); n != 1 {
		t.Errorf("billing_error holds %d rows, want 1: error queues are declared at Start", n)
	}
	errs := pub.Deliver(context.Background(), []*outbox.Message{msg("x1", "queue:nowhere"), msg("x2", "exchange:Unbound"), msg("x3", "queue:shipping")})
	if !errors.Is(errs[0], pgtransport.ErrNoQueue) {
		t.Errorf("send to an undeclared queue: %v, want ErrNoQueue", errs[0])
	}
	if errs[1] != nil || errs[2] != nil {
		t.Errorf("publish to an exchange nobody binds, and a send next to a failing one, must succeed: %v %v", errs[1], errs[2])
	}
	if n := queueLen(t, b, "shipping"); n != 3 {
		t.Errorf("shipping holds %d rows, want 3", n)
	}

	// The publisher received both endpoints' messages in order.
	ctx := t.Context()
	ch := subscribe(t, b, ctx, "shipping")
	for _, want := range []string{"o1", "c1", "x3"} {
		m := recv(t, ch)
		if m.UUID != want {
			t.Errorf("got %s, want %s (FIFO per queue)", m.UUID, want)
		}
		m.Ack()
	}
}

func TestPostgresNackDoesNotBlockTheQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := e.start(t, pgtransport.Config{RedeliveryDelay: 500 * time.Millisecond}, nil, endpoints(t, map[string][]string{"work": {"T"}})...)
	deliver(t, tr, msg("poison", "queue:work"), msg("b", "queue:work"), msg("c", "queue:work"))
	// One consumer only: if a nacked message blocked anything, it would
	// block this one.
	ch := subscribe(t, tr, t.Context(), "work")
	first := recv(t, ch)
	if first.UUID != "poison" {
		t.Fatalf("first = %s", first.UUID)
	}
	first.Nack()
	var order []string
	for len(order) < 3 {
		m := recv(t, ch)
		order = append(order, m.UUID)
		if m.UUID == "poison" {
			if m.Metadata.Get(transport.MetaRedelivered) != "true" || m.Metadata.Get(transport.MetaDeliveryCount) != "1" {
				t.Errorf("redelivered message headers: %v", m.Metadata)
			}
		}
		m.Ack()
	}
	if strings.Join(order, ",") != "b,c,poison" {
		t.Errorf("order after the nack = %v, want b,c,poison: the nacked message must step aside", order)
	}
	eventually(t, "queue empty", func() bool { return queueLen(t, tr, "work") == 0 })

	// A nacked message is visible to every consumer, not kept by the one
	// that nacked it.
	deliver(t, tr, msg("again", "queue:work"))
	m := recv(t, ch)
	ctx2, cancel2 := context.WithCancel(t.Context())
	defer cancel2()
	other := subscribe(t, tr, ctx2, "work")
	m.Nack()
	// Either consumer may take it; the other one must be able to.
	select {
	case m2 := <-other:
		m2.Ack()
	case m2 := <-ch:
		m2.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("nacked message not redelivered")
	}
}

func TestPostgresStoppingMidFlightKeepsUndeliveredRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := e.start(t, pgtransport.Config{Lease: time.Second}, nil, endpoints(t, map[string][]string{"jobs": {"T"}})...)
	for i := range 5 {
		deliver(t, tr, msg(fmt.Sprintf("m%d", i), "queue:jobs"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := subscribe(t, tr, ctx, "jobs")
	recv(t, ch).Ack()
	inFlight := recv(t, ch)
	cancel() // the router stops this consumer while m1 is in its handler
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("a stopped subscription handed out another message")
		}
		t.Fatal("the subscription closed before the message in flight had its verdict")
	case <-time.After(200 * time.Millisecond):
	}
	inFlight.Nack()
	for range ch { // closes after the verdict
	}
	if n := queueLen(t, tr, "jobs"); n != 4 {
		t.Fatalf("after stopping mid-flight the queue holds %d rows, want 4 (only the acked one is gone)", n)
	}

	// Closing the whole transport with a message in a handler: the row
	// stays leased and comes back after Lease, to another process.
	other := e.start(t, pgtransport.Config{Lease: time.Second}, nil)
	tr2 := e.start(t, pgtransport.Config{Lease: time.Second}, nil, endpoints(t, map[string][]string{"jobs": {"T"}})...)
	ch2 := subscribe(t, tr2, context.Background(), "jobs")
	held := recv(t, ch2)
	if err := tr2.Close(); err != nil {
		t.Fatal(err)
	}
	if held.Context().Err() == nil {
		t.Error("closing the transport must cancel the handler's context")
	}
	if n := queueLen(t, other, "jobs"); n != 4 {
		t.Fatalf("after closing the transport the queue holds %d rows, want 4", n)
	}
	seen := map[string]bool{}
	ch3 := subscribe(t, other, t.Context(), "jobs")
	for len(seen) < 4 {
		m := recv(t, ch3)
		if m.UUID == held.UUID && m.Metadata.Get(transport.MetaRedelivered) != "true" {
			t.Errorf("the message held at Close came back without the redelivered flag: %v", m.Metadata)
		}
		seen[m.UUID] = true
		m.Ack()
	}
	if !seen[held.UUID] || !seen[inFlight.UUID] {
		t.Errorf("redelivered: %v; want both %s and %s among them", seen, held.UUID, inFlight.UUID)
	}
}

func TestPostgresCompetingConsumersAcrossTransports(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	eps := func() []*endpoint.Endpoint { return endpoints(t, map[string][]string{"pool": {"T"}}) }
	a := e.start(t, pgtransport.Config{}, nil, eps()...)
	b := e.start(t, pgtransport.Config{}, nil, eps()...)
	const n = 300
	var (
		mu    sync.Mutex
		count = map[string]int{}
		by    = map[*pgtransport.Transport]int{}
		wg    sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	for _, tr := range []*pgtransport.Transport{a, b, a, b, a, b} {
		ch := subscribe(t, tr, ctx, "pool")
		wg.Go(func() {
			for m := range ch {
				mu.Lock()
				count[m.UUID]++
				by[tr]++
				total := len(count)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				m.Ack()
				if total == n {
					select {
					case <-done:
					default:
						close(done)
					}
				}
			}
		})
	}
	var batch []*outbox.Message
	for i := range n {
		batch = append(batch, msg(fmt.Sprintf("p%03d", i), "queue:pool"))
		if len(batch) == 50 {
			deliver(t, a, batch...)
			batch = nil
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("not all messages consumed")
	}
	time.Sleep(200 * time.Millisecond) // let any double delivery show up
	cancel()
	wg.Wait()
	for id, c := range count {
		if c != 1 {
			t.Errorf("%s delivered %d times", id, c)
		}
	}
	if len(count) != n || by[a] == 0 || by[b] == 0 {
		t.Errorf("consumed %d distinct; per transport %d / %d (both must take part)", len(count), by[a], by[b])
	}
	if l := queueLen(t, a, "pool"); l != 0 {
		t.Errorf("%d rows left", l)
	}
}

func TestPostgresLongTransactionNeitherStallsNorGoesUnnoticed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tr := e.start(t, pgtransport.Config{LongTransactionWarning: 300 * time.Millisecond, LongTransactionCheckInterval: 100 * time.Millisecond}, log,
		endpoints(t, map[string][]string{"events": {"T"}})...)
	ch := subscribe(t, tr, t.Context(), "events")

	// A transaction writes a message (taking the lower id) and stays open:
	// with snapshot-xmin based adapters this stalls everything behind it.
	tx := e.db.Begin()
	if tx.Error != nil {
		t.Fatal(tx.Error)
	}
	defer tx.Rollback()
	if err := tr.DeliverTx(gormstore.WithTx(t.Context(), tx), []*outbox.Message{msg("early", "queue:events")}); err != nil {
		t.Fatal(err)
	}
	deliver(t, tr, msg("late", "queue:events"))
	m := recv(t, ch)
	if m.UUID != "late" {
		t.Fatalf("got %s, want late", m.UUID)
	}
	m.Ack()
	eventually(t, "long-transaction warning", func() bool {
		s := logs.String()
		return strings.Contains(s, "long-running transaction") && strings.Contains(s, "age=")
	})
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if m := recv(t, ch); m.UUID != "early" {
		t.Fatalf("got %s, want early", m.UUID)
	} else {
		m.Ack()
	}
}

func TestPostgresDeliverTx(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := e.start(t, pgtransport.Config{}, nil, endpoints(t, map[string][]string{"ledger": {"T"}})...)
	ctx := t.Context()

	err := e.db.Transaction(func(tx *gorm.DB) error {
		if err := tr.DeliverTx(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("rolled-back", "exchange:T")}); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	if err == nil || err.Error() != "roll back" {
		t.Fatal(err)
	}
	if n := queueLen(t, tr, "ledger"); n != 0 {
		t.Fatalf("rolled-back transaction left %d rows", n)
	}
	err = e.db.Transaction(func(tx *gorm.DB) error {
		txCtx := gormstore.WithTx(ctx, tx)
		// A send to an undeclared queue fails before writing, so the
		// transaction stays usable.
		if err := tr.DeliverTx(txCtx, []*outbox.Message{msg("lost", "queue:nowhere")}); !errors.Is(err, pgtransport.ErrNoQueue) {
			t.Errorf("DeliverTx to an undeclared queue: %v", err)
		}
		return tr.DeliverTx(txCtx, []*outbox.Message{msg("committed", "exchange:T")})
	})
	if err != nil {
		t.Fatal(err)
	}
	m := recv(t, subscribe(t, tr, ctx, "ledger"))
	if m.UUID != "committed" {
		t.Fatalf("got %s", m.UUID)
	}
	m.Ack()

	// A transaction on another pool cannot carry the transport's rows.
	other, err := postgresdb.Open(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s, err := other.DB(); err == nil {
			_ = s.Close()
		}
	}()
	_ = other.Transaction(func(tx *gorm.DB) error {
		if err := tr.DeliverTx(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("x", "exchange:T")}); !errors.Is(err, pgtransport.ErrNotSameDatabase) {
			t.Errorf("DeliverTx on another pool: %v, want ErrNotSameDatabase", err)
		}
		return nil
	})
	if err := tr.DeliverTx(ctx, nil); !errors.Is(err, outbox.ErrNoTransaction) {
		t.Errorf("DeliverTx without a transaction: %v", err)
	}
}

func TestPostgresConfigValidation(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"1bad_", "a-b_", "semi;colon", strings.Repeat("p", 50)} {
		if err := pgtransport.ValidatePrefix(p); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
	if err := pgtransport.ValidatePrefix("Good_prefix_1_"); err != nil {
		t.Error(err)
	}
	if _, err := pgtransport.Open(nil, pgtransport.Config{}, nil); err == nil {
		t.Error("nil db accepted")
	}
	if errs := (pgtransport.Config{Lease: time.Millisecond, PollInterval: -1}).Validate(); len(errs) != 2 {
		t.Errorf("Validate = %v, want 2 problems", errs)
	}
	sql, err := pgtransport.MigrationSQL("app_")
	if err != nil || !strings.Contains(sql, "CREATE TABLE IF NOT EXISTS app_queue_messages") || !strings.Contains(sql, "bytea") {
		t.Errorf("MigrationSQL: %v\n%s", err, sql)
	}
}

func TestPostgresClosedTransportReportsUnavailable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := e.start(t, pgtransport.Config{}, nil, endpoints(t, map[string][]string{"q": {"T"}})...)
	if err := tr.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "listener up", tr.Listening)
	_ = tr.Close()
	if err := tr.Deliver(t.Context(), []*outbox.Message{msg("a", "queue:q")})[0]; !errors.Is(err, outbox.ErrTransportUnavailable) {
		t.Errorf("Deliver after Close: %v", err)
	}
	if _, err := tr.Subscriber().Subscribe(t.Context(), "q"); err == nil {
		t.Error("Subscribe after Close succeeded")
	}
}

// BenchmarkPostgresTransportThroughput measures publish→consume through the
// transport alone, with 8 consumers that ack at once. msgs/s counts
// messages consumed per second of wall time, from the first publish to
// the last ack.
//
//   - concurrent/batch=N: Deliver N messages per call (1 is Bus.Publish
//     outside a transaction; 100 is the outbox relay's batch) while the
//     consumers drain the queue;
//   - drain: the queue is filled first (untimed) and the timer covers
//     consuming only.
func BenchmarkPostgresTransportThroughput(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("concurrent/batch=%d", batch), func(b *testing.B) { benchThroughput(b, batch, 8, false) })
	}
	b.Run("drain", func(b *testing.B) { benchThroughput(b, 100, 8, true) })
}

func benchThroughput(b *testing.B, batch, consumers int, prefill bool) {
	dsn := testenv.PostgresDSN(b)
	db, err := postgresdb.Open(dsn)
	if err != nil {
		b.Fatal(err)
	}
	prefix := "pb_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_"
	defer func() {
		for _, s := range []string{"queue_messages", "queues", "bindings"} {
			db.Exec(`DROP TABLE IF EXISTS ` + prefix + s)
		}
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	}()
	tr, err := pgtransport.Open(db, pgtransport.Config{TablePrefix: prefix}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	var c endpoint.Endpoints
	c.ReceiveEndpoint("bench", func(e *endpoint.Endpoint) {
		endpoint.RawConsumer(e, func(context.Context, *endpoint.Delivery) error { return nil }, endpoint.ForTypes("T"))
	})
	if err := tr.Start(context.Background(), c.List()); err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"orderId":"12345","amount":42.5,"currency":"EUR"}`)
	publish := func() {
		var msgs []*outbox.Message
		for i := range b.N {
			msgs = append(msgs, &outbox.Message{MessageID: fmt.Sprintf("m-%d", i), Destination: "exchange:T", MessageType: "T", Payload: payload})
			if len(msgs) == batch || i == b.N-1 {
				for _, err := range tr.Deliver(context.Background(), msgs) {
					if err != nil {
						b.Fatal(err)
					}
				}
				msgs = nil
			}
		}
	}
	if prefill {
		publish()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var consumed sync.WaitGroup
	consumed.Add(b.N)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range consumers {
		ch, err := tr.Subscriber().Subscribe(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for m := range ch {
				m.Ack()
				consumed.Done()
			}
		})
	}
	if !prefill {
		publish()
	}
	all := make(chan struct{})
	go func() { consumed.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatal("not every message consumed within 5 minutes")
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	cancel()
	wg.Wait()
}

func TestPostgresNotifyWakesConsumersInOtherProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	slow := pgtransport.Config{PollInterval: 30 * time.Second} // only a NOTIFY can wake the consumers in time
	consumer := e.start(t, slow, nil, endpoints(t, map[string][]string{"inbox-a": {"Ping"}, "inbox-b": {}})...)
	publisher := e.start(t, slow, nil)
	eventually(t, "listener up", consumer.Listening)
	a := subscribe(t, consumer, t.Context(), "inbox-a")
	b := subscribe(t, consumer, t.Context(), "inbox-b")
	time.Sleep(100 * time.Millisecond) // let both consumers go idle

	within := func(ch <-chan *message.Message, want string) {
		t.Helper()
		select {
		case m := <-ch:
			if m.UUID != want {
				t.Errorf("got %s, want %s", m.UUID, want)
			}
			m.Ack()
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not delivered within 5s: the NOTIFY did not wake the other process's consumer", want)
		}
	}
	deliver(t, publisher, msg("by-exchange", "exchange:Ping"))
	within(a, "by-exchange")
	deliver(t, publisher, msg("by-queue", "queue:inbox-b"))
	within(b, "by-queue")
	// Written in a transaction: the NOTIFY leaves with the commit.
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		return publisher.DeliverTx(gormstore.WithTx(t.Context(), tx), []*outbox.Message{msg("in-tx", "exchange:Ping")})
	}); err != nil {
		t.Fatal(err)
	}
	within(a, "in-tx")
}

// TestPostgresRestartRunsNoDDLOnALiveSchema: a process starting while
// another holds an open transaction that wrote a message (a producer's
// DeliverTx, say) must not wait for it. Even CREATE INDEX IF NOT EXISTS
// takes a SHARE lock on the table, which would queue behind that
// transaction and hold every later insert behind itself.
func TestPostgresRestartRunsNoDDLOnALiveSchema(t *testing.T) {
	e := newEnv(t)
	eps := endpoints(t, map[string][]string{"live": {"Live"}})
	e.start(t, pgtransport.Config{}, nil, eps...)

	tx := e.db.Begin()
	if tx.Error != nil {
		t.Fatal(tx.Error)
	}
	defer tx.Rollback()
	if err := tx.Exec(`INSERT INTO ` + e.prefix + `queue_messages (queue, payload) VALUES ('live', '\x00')`).Error; err != nil {
		t.Fatal(err)
	}

	tr, err := pgtransport.Open(e.db, pgtransport.Config{TablePrefix: e.prefix}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	begin := time.Now()
	if err := tr.Start(ctx, eps); err != nil {
		t.Fatalf("second Start while a writer's transaction is open: %v (after %v)", err, time.Since(begin))
	}
}

// TestPostgresDeliverTxNotifiesAfterTheCommitNotInsideIt: the
// producer's transaction sends no NOTIFY (a notifying transaction holds a
// database-wide lock through its commit flush); the notification comes
// after the commit from another backend, also when the publishing
// transport was never started (a producer-only process), and OnCommitted
// hears of the committed messages only.
func TestPostgresDeliverTxNotifiesAfterTheCommitNotInsideIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	eps := endpoints(t, map[string][]string{"ledger": {"T"}})
	e.start(t, pgtransport.Config{}, nil, eps...) // declares the queue and bindings

	ctx := t.Context()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := pgx.Connect(lctx, testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(lctx, `LISTEN "`+strings.ToLower(e.prefix)+`queue_messages"`); err != nil {
		t.Fatal(err)
	}
	notes := make(chan *pgconn.Notification, 16)
	done := make(chan struct{})
	defer func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	}()
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(lctx)
			if err != nil {
				return
			}
			notes <- n
		}
	}()

	var mu sync.Mutex
	var committed []string
	producer, err := pgtransport.OpenNotify(e.db, pgtransport.Config{TablePrefix: e.prefix}, testLogger(t), func(msgs []*outbox.Message) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			committed = append(committed, m.MessageID)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close() // never started: a producer-only process

	sqlDB, err := e.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	var sent []string // every statement of the producers' transactions
	publishIn := func(id string, commit bool) {
		t.Helper()
		err := e.db.Transaction(func(tx *gorm.DB) error {
			rec := &recordingPool{ConnPool: tx.Statement.ConnPool, db: sqlDB}
			// A Session with a Context clones the Statement, so the
			// transaction's own ConnPool (its commit and rollback) stays.
			tx = tx.Session(&gorm.Session{Context: ctx})
			tx.Statement.ConnPool = rec
			defer func() { sent = append(sent, rec.sql...) }()
			if err := producer.DeliverTx(gormstore.WithTx(ctx, tx), []*outbox.Message{msg(id, "exchange:T")}); err != nil {
				return err
			}
			if !commit {
				return errors.New("roll back")
			}
			return nil
		})
		if commit && err != nil {
			t.Fatal(err)
		}
	}
	// A rolled-back transaction: watched until it ends, then nothing.
	publishIn("rolled-back", false)
	eventually(t, "watcher done with the rolled-back transaction", func() bool { return producer.CommitWatch().Pending == 0 })
	publishIn("committed", true)
	select {
	case n := <-notes:
		if n.Payload != "exchange:T" {
			t.Errorf("notification payload %q", n.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification within 5s of the commit")
	}
	if len(sent) != 2 {
		t.Errorf("recorded %d statements in the producers' transactions, want 2", len(sent))
	}
	for _, q := range sent {
		if strings.Contains(strings.ToLower(q), "notify") {
			t.Errorf("a producer's transaction ran a NOTIFY:\n%s", q)
		}
	}
	eventually(t, "OnCommitted", func() bool { mu.Lock(); defer mu.Unlock(); return len(committed) > 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(committed) != 1 || committed[0] != "committed" {
		t.Errorf("OnCommitted heard of %v, want only the committed message", committed)
	}
}

// recordingPool records the statements run through a transaction's
// connection pool; GetDBConn keeps it recognisable as the transport's pool.
type recordingPool struct {
	gorm.ConnPool
	db  *sql.DB
	sql []string
}

func (r *recordingPool) GetDBConn() (*sql.DB, error) { return r.db, nil }

func (r *recordingPool) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	r.sql = append(r.sql, q)
	return r.ConnPool.ExecContext(ctx, q, args...)
}

func (r *recordingPool) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	r.sql = append(r.sql, q)
	return r.ConnPool.QueryContext(ctx, q, args...)
}

func (r *recordingPool) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	r.sql = append(r.sql, q)
	return r.ConnPool.QueryRowContext(ctx, q, args...)
}

// TestPostgresAckTxCommitsWithTheEffects: a message acknowledged in the
// handler's transaction is gone when that transaction commits — even if
// the process stops before the ack (here: the transport closes without
// applying the verdict) — and stays when it rolls back.
func TestPostgresAckTxCommitsWithTheEffects(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	eps := endpoints(t, map[string][]string{"acks": {"A"}})
	tr, err := pgtransport.Open(e.db, pgtransport.Config{TablePrefix: e.prefix, Lease: time.Minute}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := tr.Start(ctx, eps); err != nil {
		t.Fatal(err)
	}
	deliver(t, tr, msg("rolled-back", "queue:acks"), msg("committed", "queue:acks"))
	ch := subscribe(t, tr, ctx, "acks")

	m := recv(t, ch)
	if m.UUID != "rolled-back" {
		t.Fatalf("got %s", m.UUID)
	}
	err = e.db.Transaction(func(tx *gorm.DB) error {
		acked, err := tr.AckTx(gormstore.WithTx(ctx, tx), m)
		if err != nil || !acked {
			t.Fatalf("AckTx: %v %v", acked, err)
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("no rollback")
	}
	m.Nack() // the bus settles a failed delivery normally
	m2 := recv(t, ch)
	if m2.UUID != "committed" {
		// The nacked one is held back by RedeliveryDelay; order is by id.
		t.Logf("got %s first", m2.UUID)
	}
	// Whichever came: ack it in a committed transaction and never Ack.
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		_, err := tr.AckTx(gormstore.WithTx(ctx, tx), m2)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tr.AckedInTx(m2)
	if err := tr.Close(); err != nil { // stops without applying any verdict
		t.Fatal(err)
	}
	var ids []string
	if err := e.db.Raw(`SELECT message_id FROM ` + e.prefix + `queue_messages ORDER BY id`).Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	want := []string{"committed", "rolled-back"}
	want = slices.DeleteFunc(want, func(id string) bool { return id == m2.UUID })
	if !slices.Equal(ids, want) {
		t.Fatalf("rows left %v, want %v: the row acked in a committed transaction is gone, the rolled-back ack left its row", ids, want)
	}
	// A message that is not this transport's, or a transaction on no
	// database: nothing to do.
	if acked, err := tr.AckTx(ctx, message.NewMessage("x", nil)); acked || err != nil {
		t.Errorf("AckTx of a foreign message: %v %v", acked, err)
	}
}

// TestPostgresPlainSQLProducerFansOutByBindings: docs/transports.md tells
// producers without BareWire to insert one row per queue bound to a type,
// found in the bindings table. Every endpoint consuming the type gets it.
func TestPostgresPlainSQLProducerFansOutByBindings(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := e.start(t, pgtransport.Config{}, nil, endpoints(t, map[string][]string{"sql-a": {"Sold"}, "sql-b": {"Sold"}, "sql-c": {"Other"}})...)
	err := e.db.Exec(`INSERT INTO `+e.prefix+`queue_messages (queue, message_id, metadata, payload)
SELECT queue, ?, CAST(? AS json), ? FROM `+e.prefix+`bindings WHERE exchange = ?`,
		"sold-1", `{"BW-MessageType":"Sold","content-type":"application/json"}`, []byte(`{"sku":"X"}`), "Sold").Error
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"sql-a", "sql-b"} {
		m := recv(t, subscribe(t, tr, t.Context(), q))
		if m.UUID != "sold-1" || m.Metadata.Get(wire.HeaderMessageType) != "Sold" || string(m.Payload) != `{"sku":"X"}` {
			t.Errorf("%s got %s %v %q", q, m.UUID, m.Metadata, m.Payload)
		}
		m.Ack()
	}
	if n := queueLen(t, tr, "sql-c"); n != 0 {
		t.Errorf("an endpoint of another type got %d rows", n)
	}
}
