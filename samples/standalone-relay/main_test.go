package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

type order struct {
	N int `json:"n"`
}

// TestRelayDeliversOtherProcessesRows: rows committed to the outbox by a
// bus that runs no relay (it is never started, as in a producer-only
// service) stay pending until the stand-alone relay runs; it then delivers
// each of them, before and after it started, to RabbitMQ once, with its
// message id and type, where a plain AMQP client reads them, and marks
// them delivered.
func TestRelayDeliversOtherProcessesRows(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (needs PostgreSQL and RabbitMQ); not run with -short")
	}
	dsn, url := testenv.PostgresDSN(t), testenv.AMQPURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sfx := randomSuffix(t)
	prefix := "sr_" + sfx + "_"
	typ, queue := "StandaloneRelayOrder-"+sfx, "standalone-relay-"+sfx
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The receiving side: a plain AMQP client's queue, bound to the
	// message type's exchange.
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(typ, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(typ, false, false) })
	if _, err := ch.QueueDeclare(queue, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "", typ, false, nil); err != nil {
		t.Fatal(err)
	}

	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Exec(`DROP TABLE IF EXISTS ` + prefix + `outbox`)
		db.Exec(`DROP TABLE IF EXISTS ` + prefix + `inbox`)
		_ = gormstore.Close(db)
	})
	st, err := gormstore.New(db, gormstore.WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	// The publishing side: a bus that is never started, so it runs no
	// relay; PublishTx writes outbox rows in the caller's transaction.
	// snippet:start producer
	producer, err := bus.New(
		bus.WithLogger(quiet),
		bus.WithTransport(rabbitmq.New(url, nil)),
		bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }),
	)
	// snippet:end producer
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	publish := func(n int) {
		t.Helper()
		id := fmt.Sprintf("sr-%s-%d", sfx, n)
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return producer.PublishTx(ctx, tx, order{N: n}, bus.Headers{bus.HeaderMessageID: id, bus.HeaderMessageType: typ})
		})
		if err != nil {
			t.Fatalf("PublishTx %s: %v", id, err)
		}
		want[id] = n
	}
	for n := range 3 {
		publish(n)
	}
	if s, err := st.Outbox().Stats(ctx); err != nil || s.Pending != 3 {
		t.Fatalf("outbox before the relay runs: %+v, %v; want 3 pending", s, err)
	}

	// The stand-alone relay, as main runs it.
	cfg, err := parseFlags([]string{"-postgres-dsn", dsn, "-amqp-url", url, "-prefix", prefix, "-owner", "sr-test-" + sfx, "-migrate"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- run(relayCtx, cfg, quiet, func() { close(ready) }) }()
	t.Cleanup(func() {
		stopRelay()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("relay stopped at start: %v", err)
	case <-ctx.Done():
		t.Fatal("relay did not start")
	}
	for n := 3; n < 6; n++ {
		publish(n)
	}

	// Every row is marked delivered only after the broker confirmed it,
	// so once all are, the queue holds everything the relay sent.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		s, err := st.Outbox().Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending == 0 && s.Parked == 0 && len(delivered(t, st.Outbox())) == len(want) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("outbox never drained: %+v", s)
		case <-tick.C:
		}
	}
	got := map[string]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got[d.MessageId]++
		if d.Type != typ {
			t.Errorf("message %s: type %q, want %q", d.MessageId, d.Type, typ)
		}
		var o order
		if err := json.Unmarshal(d.Body, &o); err != nil || o.N != want[d.MessageId] {
			t.Errorf("message %s: body %s (%v), want n=%d", d.MessageId, d.Body, err, want[d.MessageId])
		}
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("message %s received %d times, want once", id, got[id])
		}
	}
	for id, c := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("unexpected message %s (%d times)", id, c)
		}
	}
}

// TestHealth: GET /health is 200 while the database answers and the
// broker connection is up, 503 naming the broker once it is not.
func TestHealth(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (needs PostgreSQL and RabbitMQ); not run with -short")
	}
	dsn, url := testenv.PostgresDSN(t), testenv.AMQPURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(db) })
	tr, err := rabbitmq.New(url, nil).Build(transport.Env{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	h := healthHandler(db, tr)
	get := func() (int, map[string]string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
		var body map[string]string
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %q: %v", rec.Body, err)
		}
		return rec.Code, body
	}
	if code, body := get(); code != http.StatusOK || body["database"] != "ok" || body["broker"] != "ok" {
		t.Errorf("connected: %d %v; want 200, both ok", code, body)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if code, body := get(); code != http.StatusServiceUnavailable || body["database"] != "ok" || body["broker"] == "ok" {
		t.Errorf("broker closed: %d %v; want 503 naming the broker", code, body)
	}
}

// TestParseFlags: what the relay refuses before it connects anywhere.
func TestParseFlags(t *testing.T) {
	t.Setenv("BAREWIRE_POSTGRES_DSN", "")
	t.Setenv("BAREWIRE_AMQP_URL", "")
	for _, tc := range []struct {
		args []string
		want string // "" for no error
	}{
		{[]string{"-postgres-dsn", "host=x", "-amqp-url", "amqp://h/"}, ""},
		{[]string{"-amqp-url", "amqp://h/"}, "-postgres-dsn (or BAREWIRE_POSTGRES_DSN) is required"},
		{[]string{"-postgres-dsn", "host=x"}, "-amqp-url (or BAREWIRE_AMQP_URL) is required"},
		{[]string{"-postgres-dsn", "host=x", "-amqp-url", "amqp://h/", "-batch-size", "0"}, ""}, // 0: the default
		{[]string{"-postgres-dsn", "host=x", "-amqp-url", "amqp://h/", "-batch-size", "20000"}, "DispatchBatchSize"},
		{[]string{"-postgres-dsn", "host=x", "-amqp-url", "amqp://h/", "extra"}, "unexpected arguments"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseFlags(tc.args, io.Discard)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v; want one saying %q", err, tc.want)
			}
		})
	}
	t.Setenv("BAREWIRE_POSTGRES_DSN", "host=from-env")
	t.Setenv("BAREWIRE_AMQP_URL", "amqp://from-env/")
	c, err := parseFlags(nil, io.Discard)
	if err != nil || c.PostgresDSN != "host=from-env" || c.AMQPURL != "amqp://from-env/" {
		t.Errorf("environment defaults: %+v, %v", c, err)
	}
}

// TestRunChecksTheURLFirst: the transport's Build refuses a bad broker
// URL before the relay dials the database (whose port here refuses).
func TestRunChecksTheURLFirst(t *testing.T) {
	cfg, err := parseFlags([]string{"-postgres-dsn", "host=127.0.0.1 port=1", "-amqp-url", "amqp://"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err == nil || !strings.Contains(err.Error(), "rabbitmq: invalid URL") {
		t.Errorf("run with a bad URL: %v; want the transport's invalid URL error", err)
	}
}

// TestLinksNoWatermillSQL: a RabbitMQ + PostgreSQL program links the
// broker client and the PostgreSQL driver, but not the PostgreSQL
// transport's watermill-sql, nor another PostgreSQL driver.
func TestLinksNoWatermillSQL(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for _, p := range []string{"github.com/rabbitmq/amqp091-go", "github.com/jackc/pgx/v5"} {
		if !deps[p] {
			t.Errorf("does not link %s", p)
		}
	}
	for p := range deps {
		if strings.Contains(p, "watermill-sql") || strings.HasPrefix(p, "github.com/lib/pq") || strings.Contains(p, "barewire/transport/pgtransport") {
			t.Errorf("links %s", p)
		}
	}
}

func randomSuffix(t *testing.T) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// delivered lists s's delivered rows (Stats does not count them).
func delivered(t *testing.T, s outbox.Store) []*outbox.Message {
	t.Helper()
	rows, err := s.List(context.Background(), outbox.Query{Status: outbox.StatusDelivered, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}
