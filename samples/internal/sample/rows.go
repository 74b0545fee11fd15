package sample

import (
	"net/http"

	"github.com/barewire-go/barewire/bus"
)

// Rows serves the rows of the GORM model T from the bus's database as
// {"count": n, key: [...]}, ordered by order, at most limit rows (0: all).
// filters maps query parameters to columns: ?orderId=7 with
// {"orderId": "order_id"} keeps the rows whose order_id is 7 (a bound
// parameter, never spliced into SQL).
func Rows[T any](b *bus.Bus, key, order string, limit int, filters map[string]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		db := b.DB().WithContext(r.Context())
		for param, column := range filters {
			if v := r.URL.Query().Get(param); v != "" {
				db = db.Where(map[string]any{column: v})
			}
		}
		if limit > 0 {
			db = db.Limit(limit)
		}
		var rows []T
		if err := db.Order(order).Find(&rows).Error; err != nil {
			WriteError(w, http.StatusInternalServerError, err)
			return
		}
		WriteJSON(w, http.StatusOK, map[string]any{"count": len(rows), key: rows})
	}
}

// Stats serves the bus's counters (bus.Stats) as JSON.
func Stats(b *bus.Bus) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, b.Stats()) }
}
