package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/admin"
	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type AdminInvoice struct {
	Number string `json:"number"`
}

// adminCall sends a request to h and decodes the JSON answer into a map.
func adminCall(t *testing.T, h http.Handler, method, path, body string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q; want JSON everywhere (body %q)", method, path, ct, rec.Body.String())
	}
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s %s: %v in %q", method, path, err, rec.Body.String())
	}
	return rec.Code, out
}

// mounted mounts h under /admin the way an application would.
func mounted(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	return mux
}

func endpoints() bus.Option {
	return bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("adm-billing", func(e *endpoint.Endpoint) {
			e.ConcurrentMessageLimit = 2
			e.Retry = endpoint.Interval(4, 250*time.Millisecond)
			e.Inbox = endpoint.InboxSingleTransaction
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[AdminInvoice]) error { return nil })
		})
		c.ReceiveEndpoint("adm-audit", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error { return nil }, endpoint.ForTypes("AdminInvoice"))
		})
	}))
}

// adminBus starts a bus with the two endpoints above, stopped (and checked
// for leaked goroutines) when the test ends.
func adminBus(t *testing.T, opts ...bus.Option) *bustest.Harness {
	return bustest.New(t, append([]bus.Option{endpoints()}, opts...)...)
}

// waitFor polls cond: used only where no signal exists (database state).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// syncBuffer collects log output written from the bus's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestAdminReadOnlyRoutes(t *testing.T) {
	t.Parallel()
	hr := adminBus(t)
	b := hr.Bus
	h := mounted(admin.Handler(b))
	ctx := context.Background()
	for i := range 3 {
		if err := b.Transaction(ctx, func(tx *gorm.DB) error {
			return b.PublishTx(ctx, tx, AdminInvoice{Number: fmt.Sprint(i)}, bus.Headers{bus.HeaderMessageID: fmt.Sprintf("adm-inv-%d", i), "tenant": "acme"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	bustest.ConsumedN[AdminInvoice](hr, 6) // 3 messages, 2 endpoints
	hr.WaitIdle()

	code, idx := adminCall(t, h, "GET", "/admin/", "")
	if code != 200 || idx["actionsEnabled"] != false {
		t.Errorf("index = %d %v", code, idx)
	}

	code, eps := adminCall(t, h, "GET", "/admin/endpoints", "")
	if code != 200 {
		t.Fatalf("endpoints = %d %v", code, eps)
	}
	list := eps["endpoints"].([]any)
	billing := list[0].(map[string]any)
	if billing["name"] != "adm-billing" || billing["concurrentMessageLimit"] != 2.0 || billing["prefetchCount"] != 2.0 ||
		billing["inbox"] != "single-transaction" || billing["errorQueue"] != "adm-billing_error" {
		t.Errorf("billing endpoint = %v", billing)
	}
	if r := billing["retry"].(map[string]any); r["kind"] != "interval" || r["retries"] != 4.0 || r["interval"] != "250ms" {
		t.Errorf("retry = %v", r)
	}
	if c := billing["consumers"].([]any)[0].(map[string]any); c["messageType"] != "AdminInvoice" || c["goType"] != "admin_test.AdminInvoice" {
		t.Errorf("consumer = %v", c)
	}
	if a := list[1].(map[string]any); a["inbox"] != "two-phase" || a["consumers"].([]any)[0].(map[string]any)["raw"] != true {
		t.Errorf("audit endpoint = %v", a)
	}

	code, in := adminCall(t, h, "GET", "/admin/inbox?consumerType=adm-billing&processed=true&limit=2", "")
	entries := in["entries"].([]any)
	if code != 200 || len(entries) != 2 || in["nextOffset"] != 2.0 {
		t.Fatalf("inbox page 1 = %d %v", code, in)
	}
	if e := entries[0].(map[string]any); e["state"] != "processed" || e["consumerType"] != "adm-billing" || e["processedAt"] == nil {
		t.Errorf("inbox entry = %v", e)
	}
	_, in = adminCall(t, h, "GET", "/admin/inbox?consumerType=adm-billing&processed=true&limit=2&offset=2", "")
	if n := len(in["entries"].([]any)); n != 1 || in["nextOffset"] != nil {
		t.Errorf("inbox page 2 has %d entries, next %v; want the last one", n, in["nextOffset"])
	}
	_, in = adminCall(t, h, "GET", "/admin/inbox?messageId=adm-inv-1", "")
	if n := len(in["entries"].([]any)); n != 2 {
		t.Errorf("entries of adm-inv-1 = %d; want one per endpoint", n)
	}
	_, in = adminCall(t, h, "GET", "/admin/inbox?processed=false", "")
	if n := len(in["entries"].([]any)); n != 0 {
		t.Errorf("unprocessed entries = %d; want 0", n)
	}

	code, out := adminCall(t, h, "GET", "/admin/outbox?status=delivered&limit=2", "")
	rows := out["rows"].([]any)
	if code != 200 || len(rows) != 2 {
		t.Fatalf("outbox = %d %v", code, out)
	}
	row := rows[0].(map[string]any)
	if row["status"] != "delivered" || row["messageType"] != "AdminInvoice" || row["payloadBytes"].(float64) < 10 ||
		row["headers"].(map[string]any)["tenant"] != "acme" || row["payload"] != nil {
		t.Errorf("outbox row = %v", row)
	}
	next := out["nextAfterId"].(float64)
	_, out = adminCall(t, h, "GET", fmt.Sprintf("/admin/outbox?status=delivered&afterId=%d", int64(next)), "")
	if n := len(out["rows"].([]any)); n != 1 {
		t.Errorf("outbox page 2 = %d rows; want 1", n)
	}
	id := int64(row["id"].(float64))
	code, one := adminCall(t, h, "GET", fmt.Sprintf("/admin/outbox/%d", id), "")
	if code != 200 || one["messageId"] != row["messageId"] {
		t.Errorf("outbox/%d = %d %v", id, code, one)
	}
	if err := b.Publish(ctx, AdminInvoice{Number: "later"}, bus.Delay(time.Hour, bus.Headers{bus.HeaderMessageID: "adm-later"})); err != nil {
		t.Fatal(err)
	}
	code, out = adminCall(t, h, "GET", "/admin/outbox?scheduled=true", "")
	if rows := out["rows"].([]any); code != 200 || len(rows) != 1 || rows[0].(map[string]any)["messageId"] != "adm-later" || rows[0].(map[string]any)["availableAt"] == nil {
		t.Errorf("outbox?scheduled=true = %d %v; want the one scheduled row with availableAt", code, out)
	}
	if code, _ := adminCall(t, h, "GET", "/admin/outbox?scheduled=maybe", ""); code != 400 {
		t.Errorf("outbox?scheduled=maybe = %d; want 400", code)
	}
	if code, _ := adminCall(t, h, "GET", "/admin/outbox/999999", ""); code != 404 {
		t.Errorf("missing outbox row = %d; want 404", code)
	}

	code, st := adminCall(t, h, "GET", "/admin/stats", "")
	if code != 200 || st["bus"].(map[string]any)["consumed"] != 6.0 || st["outbox"].(map[string]any)["parked"] != 0.0 ||
		st["inbox"].(map[string]any)["locked"] != 0.0 {
		t.Errorf("stats = %d %v", code, st)
	}
	// History is not counted: its cost would grow with retention.
	if _, ok := st["outbox"].(map[string]any)["delivered"]; ok {
		t.Errorf("stats count delivered rows: %v", st["outbox"])
	}

	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/admin/outbox/requeue", `{"allParked":true}`, 403},
		{"POST", "/admin/inbox/release", `{"messageId":"x","consumerType":"y"}`, 403},
		{"GET", "/admin/inbox?processed=maybe", "", 400},
		{"GET", "/admin/inbox?limit=0", "", 400},
		{"GET", "/admin/outbox?status=lost", "", 400},
		{"GET", "/admin/outbox?afterId=-1", "", 400},
		{"GET", "/admin/nowhere", "", 404},
		{"DELETE", "/admin/inbox", "", 405},
	} {
		if code, body := adminCall(t, h, c.method, c.path, c.body); code != c.want || body["error"] == "" {
			t.Errorf("%s %s = %d %v; want %d with an error", c.method, c.path, code, body, c.want)
		}
	}
	// Mounted with a trailing-slash prefix, or at the root, it routes the same.
	mux := http.NewServeMux()
	mux.Handle("/ops/admin/", http.StripPrefix("/ops/admin/", admin.Handler(b)))
	if code, _ := adminCall(t, mux, "GET", "/ops/admin/stats", ""); code != 200 {
		t.Errorf("under /ops/admin/ = %d", code)
	}
	if code, _ := adminCall(t, admin.Handler(b), "GET", "/endpoints", ""); code != 200 {
		t.Errorf("at the root = %d", code)
	}
}

func TestAdminActionsRequeueAndRelease(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	b := adminBus(t, bus.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		bus.WithOutbox(func(o *outbox.Options) { o.MaxAttempts = 1; o.PollingInterval = time.Hour })).Bus
	testAdminActions(t, b)
	// Actions are audited through the bus's logger.
	for _, want := range []string{"admin: parked outbox rows requeued", "admin: inbox lock released", "consumer_type=adm-billing"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

func TestAdminActionsOnPostgres(t *testing.T) {
	t.Parallel()
	db, err := postgresdb.Open(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	prefix := "adm_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_"
	t.Cleanup(func() {
		for _, tbl := range []string{"inbox", "outbox"} {
			db.Exec(`DROP TABLE IF EXISTS "` + prefix + tbl + `"`)
		}
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	b := adminBus(t, bus.WithDatabase(db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix; o.MaxAttempts = 1; o.PollingInterval = time.Hour })).Bus
	testAdminActions(t, b)
}

// testAdminActions runs on a bus whose relay polls once an hour: a requeued
// row is attempted again at once only because the handler wakes the relay.
func testAdminActions(t *testing.T, b *bus.Bus) {
	h := mounted(admin.Handler(b, admin.AllowActions()))
	ctx := context.Background()

	if code, idx := adminCall(t, h, "GET", "/admin/", ""); code != 200 || idx["actionsEnabled"] != true {
		t.Errorf("index = %d %v", code, idx)
	}
	// A row for a queue nobody declared parks after its one attempt.
	if err := b.Transaction(ctx, func(tx *gorm.DB) error {
		return b.SendTx(ctx, tx, "queue:adm-nowhere", AdminInvoice{Number: "lost"}, bus.Headers{bus.HeaderMessageID: "adm-parked-1"})
	}); err != nil {
		t.Fatal(err)
	}
	var parkedID float64
	waitFor(t, func() bool {
		_, out := adminCall(t, h, "GET", "/admin/outbox?status=parked", "")
		if rows := out["rows"].([]any); len(rows) == 1 {
			row := rows[0].(map[string]any)
			parkedID = row["id"].(float64)
			return row["lastError"] != ""
		}
		return false
	})
	// Let the relay's short re-checks after its last pass (about 200ms in
	// all) run out: from then on only a wake-up makes it look again within
	// the hour. Not a synchronisation: too short a pause only weakens the
	// check of the wake-up below.
	time.Sleep(400 * time.Millisecond)
	code, res := adminCall(t, h, "POST", "/admin/outbox/requeue", fmt.Sprintf(`{"ids":[%d]}`, int64(parkedID)))
	if code != 200 || res["requeued"] != 1.0 {
		t.Fatalf("requeue by id = %d %v", code, res)
	}
	waitFor(t, func() bool { // woken, the relay tries it again at once: it fails and parks again
		_, out := adminCall(t, h, "GET", "/admin/outbox?status=parked", "")
		return len(out["rows"].([]any)) == 1
	})
	if code, res := adminCall(t, h, "POST", "/admin/outbox/requeue", `{"allParked":true}`); code != 200 || res["requeued"] != 1.0 {
		t.Errorf("requeue all = %d %v", code, res)
	}
	for _, body := range []string{`{}`, `{"ids":[1],"allParked":true}`, `{"bogus":1}`, `not json`} {
		if code, _ := adminCall(t, h, "POST", "/admin/outbox/requeue", body); code != 400 {
			t.Errorf("requeue %s = %d; want 400", body, code)
		}
	}

	// A stuck lock: taken by a delivery that will never finish.
	key := inbox.Key{MessageID: "adm-stuck-1", ConsumerType: "adm-billing"}
	lock, err := b.InboxStore().TryLock(ctx, key, time.Hour)
	if err != nil || lock.State != inbox.Acquired {
		t.Fatalf("TryLock = %+v, %v", lock, err)
	}
	_, in := adminCall(t, h, "GET", "/admin/inbox?messageId=adm-stuck-1", "")
	if e := in["entries"].([]any)[0].(map[string]any); e["state"] != "locked" {
		t.Errorf("stuck entry state = %v; want locked", e["state"])
	}
	if again, _ := b.InboxStore().TryLock(ctx, key, time.Hour); again.State != inbox.Busy {
		t.Fatalf("second TryLock = %v; want busy before the release", again.State)
	}
	code, res = adminCall(t, h, "POST", "/admin/inbox/release", `{"messageId":"adm-stuck-1","consumerType":"adm-billing"}`)
	if code != 200 || res["released"] != 1.0 {
		t.Fatalf("release = %d %v", code, res)
	}
	if again, err := b.InboxStore().TryLock(ctx, key, time.Hour); err != nil || again.State != inbox.Acquired {
		t.Errorf("TryLock after release = %+v, %v; want acquired", again, err)
	}
	// The old holder's token no longer commits.
	if err := b.InboxStore().Process(ctx, key, lock.Token, func(context.Context) error { return nil }); err == nil {
		t.Error("the released holder could still mark the entry processed")
	}
	if code, _ := adminCall(t, h, "POST", "/admin/inbox/release", `{"messageId":"adm-nope","consumerType":"adm-billing"}`); code != 404 {
		t.Errorf("release of a missing entry = %d; want 404", code)
	}
	if code, _ := adminCall(t, h, "POST", "/admin/inbox/release", `{"messageId":"adm-stuck-1"}`); code != 400 {
		t.Errorf("release without consumerType = %d; want 400", code)
	}
	req := httptest.NewRequest("POST", "/admin/inbox/release", strings.NewReader(`{"messageId":"a","consumerType":"b"}`))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnsupportedMediaType {
		t.Errorf("form-encoded action = %d; want 415", rec.Code)
	}
}

// Before Start there are no stores: the routes that read them answer 503,
// the declarations are served already.
func TestAdminBeforeStart(t *testing.T) {
	t.Parallel()
	b, err := bus.New(endpoints(), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	h := admin.Handler(b, admin.AllowActions())
	if code, body := adminCall(t, h, "GET", "/endpoints", ""); code != 200 || len(body["endpoints"].([]any)) != 2 {
		t.Errorf("endpoints before Start = %d %v", code, body)
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/stats", ""}, {"GET", "/inbox", ""}, {"GET", "/outbox", ""}, {"GET", "/outbox/1", ""},
		{"POST", "/outbox/requeue", `{"allParked":true}`}, {"POST", "/inbox/release", `{"messageId":"a","consumerType":"b"}`},
	} {
		if code, body := adminCall(t, h, c.method, c.path, c.body); code != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(body["error"]), "not started") {
			t.Errorf("%s %s before Start = %d %v; want 503 saying the bus is not started", c.method, c.path, code, body)
		}
	}
	if code, _ := adminCall(t, admin.Handler(nil), "GET", "/stats", ""); code != http.StatusInternalServerError {
		t.Errorf("nil bus = %d; want 500", code)
	}
}
