package bus

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// HealthHandler serves the health endpoints samples and services mount:
// "/health" and "/health/ready" answer 200 when Health is nil and 503
// otherwise; "/health/live" answers 200 while the process serves HTTP. Mount
// it at the root or under a prefix with http.StripPrefix.
func (b *Bus) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/live") {
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "alive"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := b.Health(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "unhealthy", "error": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "healthy"})
	})
}
