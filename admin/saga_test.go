package admin_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/barewire-go/barewire/admin"
	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/inproc"
)

type AdmShipment struct {
	saga.State
	Carrier string `json:"carrier"`
	Secret  string `json:"-"`
}

type AdmShipmentOpened struct{ ID, Carrier string }
type AdmShipmentSent struct{ ID string }

// TestAdminSagas: the saga routes list machines with counts by state,
// instances by state, and one instance by correlation id; unknown machines
// and instances are 404s that say why.
func TestAdminSagas(t *testing.T) {
	t.Parallel()
	m, err := saga.New("adm-shipping", func(m *saga.Machine[AdmShipment]) {
		open := m.State("Open")
		sent := m.State("Sent")
		opened := saga.NewEvent(m, func(e AdmShipmentOpened) string { return e.ID })
		dispatched := saga.NewEvent(m, func(e AdmShipmentSent) string { return e.ID })
		m.Initially(saga.When(opened).Then(func(ctx context.Context, c *saga.Context[AdmShipment, AdmShipmentOpened]) error {
			c.Instance.Carrier, c.Instance.Secret = c.Message.Carrier, "hidden"
			return nil
		}).TransitionTo(open))
		m.During(open, saga.When(dispatched).TransitionTo(sent))
	}, saga.WithTable("adm_shipments"))
	if err != nil {
		t.Fatal(err)
	}
	hr := bustest.New(t, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("adm-shipping", func(e *endpoint.Endpoint) { saga.Register(e, m) })
	})))
	b := hr.Bus
	ctx := context.Background()
	if err := saga.Migrate(ctx, b.DB(), m); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"s/1", "s2", "s3"} {
		if err := b.Publish(ctx, AdmShipmentOpened{ID: id, Carrier: "dhl"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	bustest.ConsumedN[AdmShipmentOpened](hr, 3)
	if err := b.Publish(ctx, AdmShipmentSent{ID: "s2"}, nil); err != nil {
		t.Fatal(err)
	}
	bustest.ConsumedN[AdmShipmentSent](hr, 1)
	hr.WaitIdle()

	h := mounted(admin.Handler(b, admin.Sagas(m)))
	code, out := adminCall(t, h, "GET", "/admin/sagas", "")
	sagas, _ := out["sagas"].([]any)
	if code != 200 || len(sagas) != 1 {
		t.Fatalf("GET /sagas = %d %v", code, out)
	}
	s := sagas[0].(map[string]any)
	states := s["states"].(map[string]any)
	if s["name"] != "adm-shipping" || s["table"] != "adm_shipments" || s["total"] != 3.0 || states["Open"] != 2.0 || states["Sent"] != 1.0 {
		t.Errorf("GET /sagas: %v", s)
	}

	code, out = adminCall(t, h, "GET", "/admin/sagas/adm-shipping?state=Open", "")
	insts, _ := out["instances"].([]any)
	if code != 200 || len(insts) != 2 {
		t.Fatalf("GET /sagas/adm-shipping?state=Open = %d %v", code, out)
	}
	for _, i := range insts {
		inst := i.(map[string]any)
		if inst["currentState"] != "Open" || inst["carrier"] != "dhl" || inst["version"] != 1.0 {
			t.Errorf("instance %v", inst)
		}
		if _, ok := inst["Secret"]; ok {
			t.Errorf("a json:\"-\" field was shown: %v", inst)
		}
	}
	code, out = adminCall(t, h, "GET", "/admin/sagas/adm-shipping?limit=1", "")
	if insts, _ := out["instances"].([]any); code != 200 || len(insts) != 1 {
		t.Errorf("limit=1: %d %v", code, out)
	}
	code, out = adminCall(t, h, "GET", "/admin/sagas/adm-shipping/s%2F1", "")
	if code != 200 || out["correlationId"] != "s/1" || out["currentState"] != "Open" {
		t.Errorf("GET one instance = %d %v", code, out)
	}
	code, out = adminCall(t, h, "GET", "/admin/sagas/adm-shipping/s2", "")
	if code != 200 || out["currentState"] != "Sent" || out["version"] != 2.0 {
		t.Errorf("GET s2 = %d %v", code, out)
	}
	for path, want := range map[string]int{
		"/admin/sagas/adm-shipping/nobody":    404,
		"/admin/sagas/unknown":                404,
		"/admin/sagas/unknown/s2":             404,
		"/admin/sagas/adm-shipping?limit=0":   400,
		"/admin/sagas/adm-shipping?limit=abc": 400,
	} {
		if code, out := adminCall(t, h, "GET", path, ""); code != want || out["error"] == nil {
			t.Errorf("GET %s = %d %v, want %d with an error", path, code, out, want)
		}
	}
	// Read-only: no write route exists under /sagas.
	if code, _ := adminCall(t, admin.Handler(b, admin.Sagas(m), admin.AllowActions()), "POST", "/sagas/adm-shipping/s2", `{}`); code != 405 && code != 404 {
		t.Errorf("POST to a saga = %d", code)
	}
	// Without Sagas the list is empty.
	if code, out := adminCall(t, admin.Handler(b), "GET", "/sagas", ""); code != 200 || len(out["sagas"].([]any)) != 0 {
		t.Errorf("GET /sagas without Sagas = %d %v", code, out)
	}
}

// TestAdminSagasBeforeStart: before Start there is no database: 503.
func TestAdminSagasBeforeStart(t *testing.T) {
	t.Parallel()
	b, err := bus.New(bus.WithTransport(inproc.New(func(c *inproc.Config) {})))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	admin.Handler(b).ServeHTTP(rec, httptest.NewRequest("GET", "/sagas", nil))
	if rec.Code != 503 {
		t.Errorf("GET /sagas before Start = %d %s", rec.Code, rec.Body)
	}
}
