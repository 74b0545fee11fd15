package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/barewire-go/barewire/transport"
)

// Health check names, as reported in HealthReport.Checks.
const (
	HealthCheckBus       = "bus"
	HealthCheckTransport = "transport"
	HealthCheckDatabase  = "database"
	HealthCheckRelay     = "relay"
)

// Health thresholds used unless WithHealthThresholds says otherwise.
const (
	DefaultHealthMaxOldestPending       = 5 * time.Minute
	DefaultHealthMaxPending       int64 = 100_000
)

type healthConfig struct {
	set              bool
	maxOldestPending time.Duration
	maxPending       int64
}

// WithHealthThresholds sets when the relay check reports the outbox as
// stalled: when its oldest due pending row has been due for longer than
// maxOldestPending (failed rows: since they were written), or more than
// maxPending rows are pending, not counting the rows scheduled for later
// (bus.Delay, bus.DeliverAt, delayed redeliveries), which count in
// neither until they fall due. Zero disables that
// half of the check. Defaults to 5 minutes and 100000 rows.
func WithHealthThresholds(maxOldestPending time.Duration, maxPending int64) Option {
	return func(c *config) error {
		if maxOldestPending < 0 || maxPending < 0 {
			return optErr("WithHealthThresholds: %v and %d must not be negative (zero disables a threshold)", maxOldestPending, maxPending)
		}
		c.health = healthConfig{set: true, maxOldestPending: maxOldestPending, maxPending: maxPending}
		return nil
	}
}

func (b *Bus) healthThresholds() (time.Duration, int64) {
	if !b.cfg.health.set {
		return DefaultHealthMaxOldestPending, DefaultHealthMaxPending
	}
	return b.cfg.health.maxOldestPending, b.cfg.health.maxPending
}

// HealthCheck is the result of one check.
type HealthCheck struct {
	Name string `json:"name"`
	// Status is "pass" or "fail".
	Status string `json:"status"`
	// Error says what failed.
	Error string `json:"error,omitempty"`
	// Details are the numbers the check looked at.
	Details map[string]any `json:"details,omitempty"`

	err error
}

// HealthReport is the result of every check.
type HealthReport struct {
	// Status is "healthy" when every check passed, else "unhealthy".
	Status string        `json:"status"`
	Checks []HealthCheck `json:"checks"`
}

// Err returns nil when every check passed, otherwise the failures joined,
// each prefixed with its check's name (the bus check's ErrNotStarted or
// ErrStopping as it is).
func (r HealthReport) Err() error {
	var errs []error
	for _, c := range r.Checks {
		switch {
		case c.err == nil:
		case c.Name == HealthCheckBus:
			errs = append(errs, c.err)
		default:
			errs = append(errs, fmt.Errorf("%s: %w", c.Name, c.err))
		}
	}
	return errors.Join(errs...)
}

// CheckHealth runs every health check: the bus is started, the transport
// is connected, the database answers, and the relay keeps up (the oldest
// pending outbox row and the pending count are within WithHealthThresholds;
// the counts are at most a few seconds old).
func (b *Bus) CheckHealth(ctx context.Context) HealthReport {
	var r HealthReport
	add := func(name string, err error, details map[string]any) {
		c := HealthCheck{Name: name, Status: "pass", Details: details, err: err}
		if err != nil {
			c.Status, c.Error = "fail", err.Error()
		}
		r.Checks = append(r.Checks, c)
	}
	if state := b.state.Load(); state != stateStarted {
		err := ErrNotStarted
		if state == stateStopping {
			err = ErrStopping
		}
		add(HealthCheckBus, err, nil)
		r.Status = "unhealthy"
		return r
	}
	add(HealthCheckBus, nil, nil)
	trDetails := map[string]any{"transport": b.system}
	if hd, ok := b.tr.(transport.HealthDetailer); ok {
		for k, v := range hd.HealthDetails() {
			if _, taken := trDetails[k]; !taken {
				trDetails[k] = v
			}
		}
	}
	add(HealthCheckTransport, b.tr.Health(ctx), trDetails)
	var dbErr error
	if sqlDB, err := b.db.DB(); err != nil {
		dbErr = err
	} else {
		dbErr = sqlDB.PingContext(ctx)
	}
	since, cause, outages := b.gate.state()
	dbDetails := map[string]any{"consumptionPaused": !since.IsZero(), "outages": outages}
	if !since.IsZero() {
		dbDetails["pausedForSeconds"] = time.Since(since).Seconds()
		if dbErr == nil {
			// The ping answered but the prober has not yet resumed.
			dbErr = fmt.Errorf("consumption paused since %s: %s", since.UTC().Format(time.RFC3339), cause)
		}
	}
	add(HealthCheckDatabase, dbErr, dbDetails)
	details, err := b.checkRelay(ctx)
	add(HealthCheckRelay, err, details)

	r.Status = "healthy"
	if r.Err() != nil {
		r.Status = "unhealthy"
	}
	return r
}

// checkRelay compares the outbox backlog with the thresholds.
func (b *Bus) checkRelay(ctx context.Context) (map[string]any, error) {
	maxAge, maxPending := b.healthThresholds()
	st, err := b.cachedOutboxStats(ctx)
	if err != nil {
		return nil, fmt.Errorf("read outbox stats: %w", err)
	}
	var age time.Duration
	if !st.OldestPending.IsZero() {
		age = max(time.Since(st.OldestPending), 0)
	}
	details := map[string]any{
		"pending":                 st.Pending,
		"scheduled":               st.Scheduled,
		"parked":                  st.Parked,
		"oldestPendingAgeSeconds": age.Seconds(),
		"maxOldestPendingSeconds": maxAge.Seconds(),
		"maxPending":              maxPending,
	}
	var errs []error
	if maxAge > 0 && age > maxAge {
		errs = append(errs, fmt.Errorf("oldest pending outbox row is %v old (threshold %v): the relay is stalled or the broker refuses messages", age.Round(time.Second), maxAge))
	}
	// Rows scheduled for later are waiting by design, not a backlog.
	if due := st.Pending - st.Scheduled; maxPending > 0 && due > maxPending {
		errs = append(errs, fmt.Errorf("%d outbox rows pending (threshold %d; %d more scheduled for later): the relay is not keeping up", due, maxPending, st.Scheduled))
	}
	return details, errors.Join(errs...)
}

// HealthHandler serves the health endpoints samples and services mount:
// "/health" and "/health/ready" answer 200 when every check passes and 503
// otherwise, with the HealthReport as JSON (which check failed and why);
// "/health/live" answers 200 while the process serves HTTP. Mount it at the
// root or under a prefix with http.StripPrefix.
func (b *Bus) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if strings.HasSuffix(r.URL.Path, "/live") {
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "alive"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		rep := b.CheckHealth(ctx)
		if rep.Status != "healthy" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
}
