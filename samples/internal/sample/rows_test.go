package sample_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/samples/internal/sample"
)

type row struct {
	ID      int64  `json:"id"`
	OrderID string `json:"orderId"`
}

func (row) TableName() string { return "sample_rows_test" }

func TestRowsOrdersLimitsAndFilters(t *testing.T) {
	b, err := bus.New(bus.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	if err := b.DB().AutoMigrate(&row{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"a", "b", "a", "c"} {
		if err := b.DB().Create(&row{OrderID: o}).Error; err != nil {
			t.Fatal(err)
		}
	}
	get := func(h http.HandlerFunc, query string) (n int, ids []int64) {
		w := httptest.NewRecorder()
		h(w, httptest.NewRequest(http.MethodGet, "/rows"+query, nil))
		var out struct {
			Count int   `json:"count"`
			Rows  []row `json:"rows"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || w.Code != http.StatusOK {
			t.Fatalf("%d %s: %v", w.Code, w.Body, err)
		}
		for _, r := range out.Rows {
			ids = append(ids, r.ID)
		}
		return out.Count, ids
	}
	h := sample.Rows[row](b, "rows", "id DESC", 3, map[string]string{"orderId": "order_id"})
	if n, ids := get(h, ""); n != 3 || ids[0] != 4 || ids[2] != 2 {
		t.Errorf("newest 3: %d %v", n, ids)
	}
	if n, ids := get(h, "?orderId=a"); n != 2 || ids[0] != 3 || ids[1] != 1 {
		t.Errorf("orderId=a: %d %v", n, ids)
	}
	// A value that would be SQL if spliced in is just a value that matches nothing.
	if n, _ := get(h, "?orderId=a'%20OR%20'1'='1"); n != 0 {
		t.Errorf("injection attempt matched %d rows", n)
	}
	if n, _ := get(sample.Rows[row](b, "rows", "id", 0, nil), "?orderId=a"); n != 4 {
		t.Errorf("no limit, unknown parameter ignored: %d rows", n)
	}
}
