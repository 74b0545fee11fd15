package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/view"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/saga"
)

// Option configures Handler.
type Option func(*config)

type config struct {
	allowActions bool
	sagas        []saga.Inspector
}

// AllowActions enables the handler's write actions (POST outbox/requeue and
// inbox/release). Without it the handler is read-only and answers them
// with 403.
func AllowActions() Option {
	return func(c *config) { c.allowActions = true }
}

// Paging limits.
const (
	defaultLimit = 50
	maxLimit     = 1000
)

// Handler returns an HTTP handler for inspecting b, JSON everywhere. It
// routes on paths relative to where it is mounted, so mount it under any
// prefix with http.StripPrefix:
//
//	mux.Handle("/admin/", http.StripPrefix("/admin", admin.Handler(b)))
//
// The routes are listed in the package documentation. The stores are read
// on each request: before b.Start the routes that need them answer 503.
// Actions are logged at info through b.Logger().
func Handler(b *bus.Bus, opts ...Option) http.Handler {
	if b == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusInternalServerError, errors.New("admin: Handler was given a nil *bus.Bus"))
		})
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	a := &handler{b: b, cfg: cfg, log: b.Logger()}
	mux := http.NewServeMux()
	routes := []struct {
		method, path string
		h            http.HandlerFunc
	}{
		{"GET", "/{$}", a.index},
		{"GET", "/endpoints", a.endpoints},
		{"GET", "/stats", a.stats},
		{"GET", "/inbox", a.inboxList},
		{"GET", "/outbox", a.outboxList},
		{"GET", "/outbox/{id}", a.outboxShow},
		{"GET", "/sagas", a.sagas},
		{"GET", "/sagas/{machine}", a.sagaList},
		{"GET", "/sagas/{machine}/{id...}", a.sagaShow},
		{"POST", "/outbox/requeue", a.action(a.outboxRequeue)},
		{"POST", "/inbox/release", a.action(a.inboxRelease)},
	}
	allowed := map[string][]string{}
	for _, r := range routes {
		mux.HandleFunc(r.method+" "+r.path, r.h)
		p := strings.TrimSuffix(r.path, "{$}")
		allowed[p] = append(allowed[p], r.method)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if methods, ok := allowed[r.URL.Path]; ok {
			w.Header().Set("Allow", strings.Join(methods, ", "))
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("%s %s: method not allowed (use %s)", r.Method, r.URL.Path, strings.Join(methods, " or ")))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Errorf("%s: no such admin route; GET / lists them", r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// http.StripPrefix("/admin/", …) leaves "inbox"; "/admin" leaves "".
		if !strings.HasPrefix(r.URL.Path, "/") {
			r2 := new(http.Request)
			*r2 = *r
			u := *r.URL
			u.Path = "/" + u.Path
			u.RawPath = ""
			r2.URL = &u
			r = r2
		}
		mux.ServeHTTP(w, r)
	})
}

type handler struct {
	b   *bus.Bus
	cfg config
	log *slog.Logger
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// stores returns the stores, or answers 503 before Start.
func (a *handler) stores(w http.ResponseWriter) (inbox.Store, outbox.Store, bool) {
	in, out := a.b.InboxStore(), a.b.OutboxStore()
	if in == nil || out == nil {
		writeError(w, http.StatusServiceUnavailable, bus.ErrNotStarted)
		return nil, nil, false
	}
	return in, out, true
}

func (a *handler) index(w http.ResponseWriter, r *http.Request) {
	routes := []string{"GET /endpoints", "GET /stats", "GET /inbox", "GET /outbox", "GET /outbox/{id}", "GET /sagas", "GET /sagas/{name}", "GET /sagas/{name}/{correlationId}"}
	actions := []string{"POST /outbox/requeue", "POST /inbox/release"}
	writeJSON(w, http.StatusOK, map[string]any{"routes": routes, "actions": actions, "actionsEnabled": a.cfg.allowActions})
}

// ---- endpoints ----

type endpointView struct {
	Name                   string         `json:"name"`
	Consumers              []consumerView `json:"consumers"`
	MessageTypes           []string       `json:"messageTypes"`
	PrefetchCount          int            `json:"prefetchCount"`
	ConcurrentMessageLimit int            `json:"concurrentMessageLimit"`
	Retry                  retryView      `json:"retry"`
	Redelivery             []string       `json:"redelivery,omitempty"`
	Inbox                  string         `json:"inbox"`
	MissingMessageID       string         `json:"missingMessageId"`
	HandlerTimeout         string         `json:"handlerTimeout,omitempty"`
	ErrorQueue             string         `json:"errorQueue"`
	QueueType              string         `json:"queueType,omitempty"`
	Bindings               []bindingView  `json:"bindings,omitempty"`
}

type consumerView struct {
	Name        string   `json:"name"`
	MessageType string   `json:"messageType,omitempty"`
	Types       []string `json:"types,omitempty"`
	GoType      string   `json:"goType,omitempty"`
	Raw         bool     `json:"raw,omitempty"`
}

type retryView struct {
	Kind                string  `json:"kind"`
	Retries             int     `json:"retries"`
	Interval            string  `json:"interval,omitempty"`
	Increment           string  `json:"increment,omitempty"`
	MaxInterval         string  `json:"maxInterval,omitempty"`
	Multiplier          float64 `json:"multiplier,omitempty"`
	RandomizationFactor float64 `json:"randomizationFactor,omitempty"`
	CustomFilter        bool    `json:"customFilter,omitempty"`
}

type bindingView struct {
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routingKey,omitempty"`
}

func durString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

func retryKind(k endpoint.RetryKind) string {
	switch k {
	case endpoint.RetryNone:
		return "none"
	case endpoint.RetryImmediate:
		return "immediate"
	case endpoint.RetryInterval:
		return "interval"
	case endpoint.RetryIncremental:
		return "incremental"
	case endpoint.RetryExponential:
		return "exponential"
	}
	return "default"
}

func inboxMode(m endpoint.InboxMode) string {
	switch m {
	case endpoint.InboxTwoPhase:
		return "two-phase"
	case endpoint.InboxSingleTransaction:
		return "single-transaction"
	case endpoint.InboxOff:
		return "off"
	}
	return strconv.Itoa(int(m))
}

func describeEndpoint(ep *endpoint.Endpoint) endpointView {
	e := endpointView{
		Name:                   ep.Name(),
		MessageTypes:           ep.MessageTypes(),
		PrefetchCount:          ep.PrefetchCount,
		ConcurrentMessageLimit: ep.ConcurrentMessageLimit,
		Retry: retryView{
			Kind: retryKind(ep.Retry.Kind), Retries: ep.Retry.Retries,
			Interval: durString(ep.Retry.Interval), Increment: durString(ep.Retry.Increment),
			MaxInterval: durString(ep.Retry.MaxInterval), Multiplier: ep.Retry.Multiplier,
			RandomizationFactor: ep.Retry.RandomizationFactor, CustomFilter: ep.Retry.ShouldRetry != nil,
		},
		Inbox:            inboxMode(ep.Inbox),
		MissingMessageID: "reject",
		HandlerTimeout:   durString(ep.HandlerTimeout),
		ErrorQueue:       ep.ErrorQueue,
		QueueType:        string(ep.Queue.Type),
	}
	if e.MessageTypes == nil {
		e.MessageTypes = []string{}
	}
	if ep.MissingMessageID == endpoint.ProcessMissingID {
		e.MissingMessageID = "process"
	}
	for _, d := range ep.Redelivery {
		e.Redelivery = append(e.Redelivery, d.String())
	}
	for _, r := range ep.Consumers() {
		c := consumerView{Name: r.Name, MessageType: r.MessageType, Types: r.Types, Raw: r.GoType == nil}
		if r.GoType != nil {
			c.GoType = r.GoType.String()
		}
		e.Consumers = append(e.Consumers, c)
	}
	for _, bd := range ep.Bindings {
		e.Bindings = append(e.Bindings, bindingView{Exchange: bd.Exchange, RoutingKey: bd.RoutingKey})
	}
	return e
}

func (a *handler) endpoints(w http.ResponseWriter, r *http.Request) {
	out := []endpointView{}
	for _, ep := range a.b.Endpoints() {
		out = append(out, describeEndpoint(ep))
	}
	writeJSON(w, http.StatusOK, map[string]any{"endpoints": out})
}

// ---- stats ----

type outboxStats struct {
	Pending                 int64      `json:"pending"`
	Parked                  int64      `json:"parked"`
	OldestPending           *time.Time `json:"oldestPending,omitempty"`
	OldestPendingAgeSeconds float64    `json:"oldestPendingAgeSeconds"`
}

type inboxStats struct {
	Locked  int64 `json:"locked"`
	Expired int64 `json:"expired"`
}

func (a *handler) stats(w http.ResponseWriter, r *http.Request) {
	in, out, ok := a.stores(w)
	if !ok {
		return
	}
	ost, err := out.Stats(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	is, err := in.Stats(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	o := outboxStats{Pending: ost.Pending, Parked: ost.Parked}
	if !ost.OldestPending.IsZero() {
		t := ost.OldestPending.UTC()
		o.OldestPending = &t
		o.OldestPendingAgeSeconds = max(time.Since(t).Seconds(), 0)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"bus":    lowerFields(a.b.Stats()),
		"outbox": o,
		"inbox":  inboxStats{Locked: is.Locked, Expired: is.Expired},
	})
}

// lowerFields turns a struct of counters into a map keyed by its field
// names in lower camel case, so that new counters show up by themselves.
func lowerFields(v any) map[string]any {
	out := map[string]any{}
	rv := reflect.ValueOf(v)
	rt := rv.Type()
	for i := range rt.NumField() {
		f := rt.Field(i)
		if !f.IsExported() {
			continue
		}
		r, n := utf8.DecodeRuneInString(f.Name)
		out[string(unicode.ToLower(r))+f.Name[n:]] = rv.Field(i).Interface()
	}
	return out
}

// ---- inbox ----

func queryInt(r *http.Request, name string, def, lo, hi int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want an integer within %d–%d", name, s, lo, hi)
	}
	return n, nil
}

func (a *handler) inboxList(w http.ResponseWriter, r *http.Request) {
	in, _, ok := a.stores(w)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit, err := queryInt(r, "limit", defaultLimit, 1, maxLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	offset, err := queryInt(r, "offset", 0, 0, 1<<31-1)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	iq := inbox.Query{MessageID: q.Get("messageId"), ConsumerType: q.Get("consumerType"), Offset: offset, Limit: limit}
	if p := q.Get("processed"); p != "" {
		v, err := strconv.ParseBool(p)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("processed=%q: want true or false", p))
			return
		}
		iq.Processed = &v
	}
	entries, err := in.List(r.Context(), iq)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	resp := map[string]any{"entries": view.Inboxes(entries, time.Now()), "limit": limit, "offset": offset}
	if len(entries) == limit {
		resp["nextOffset"] = offset + limit
	}
	writeJSON(w, http.StatusOK, resp)
}

// ---- outbox ----

func parseStatus(s string) (outbox.Status, error) {
	switch st := outbox.Status(s); st {
	case "", outbox.StatusPending, outbox.StatusParked, outbox.StatusDelivered:
		return st, nil
	}
	return "", fmt.Errorf("status=%q: want pending, parked or delivered", s)
}

func (a *handler) outboxList(w http.ResponseWriter, r *http.Request) {
	_, out, ok := a.stores(w)
	if !ok {
		return
	}
	status, err := parseStatus(r.URL.Query().Get("status"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	limit, err := queryInt(r, "limit", defaultLimit, 1, maxLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	var after int64
	if s := r.URL.Query().Get("afterId"); s != "" {
		if after, err = strconv.ParseInt(s, 10, 64); err != nil || after < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("afterId=%q: want a non-negative integer", s))
			return
		}
	}
	var scheduled bool
	if s := r.URL.Query().Get("scheduled"); s != "" {
		if scheduled, err = strconv.ParseBool(s); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("scheduled=%q: want true or false", s))
			return
		}
	}
	msgs, err := out.List(r.Context(), outbox.Query{Status: status, AfterID: after, Limit: limit, Scheduled: scheduled})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	resp := map[string]any{"rows": view.Outboxes(msgs), "limit": limit}
	if len(msgs) == limit {
		resp["nextAfterId"] = msgs[len(msgs)-1].ID
	}
	writeJSON(w, http.StatusOK, resp)
}

func (a *handler) outboxShow(w http.ResponseWriter, r *http.Request) {
	_, out, ok := a.stores(w)
	if !ok {
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("outbox id %q: want a positive integer", r.PathValue("id")))
		return
	}
	msgs, err := out.List(r.Context(), outbox.Query{AfterID: id - 1, Limit: 1})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if len(msgs) == 0 || msgs[0].ID != id {
		writeError(w, http.StatusNotFound, fmt.Errorf("outbox row %d not found (delivered rows are deleted after their retention)", id))
		return
	}
	writeJSON(w, http.StatusOK, view.Outbox(msgs[0]))
}

// ---- actions ----

// action guards a write route: actions enabled, and a JSON body (which a
// cross-site form cannot send without a CORS preflight).
func (a *handler) action(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.cfg.allowActions {
			writeError(w, http.StatusForbidden, errors.New("admin actions are disabled; enable them with admin.Handler(b, admin.AllowActions())"))
			return
		}
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, errors.New("send the action's body as JSON with Content-Type: application/json"))
			return
		}
		h(w, r)
	}
}

func readBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty body")
		}
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

type requeueRequest struct {
	IDs       []int64 `json:"ids"`
	AllParked bool    `json:"allParked"`
}

func (a *handler) outboxRequeue(w http.ResponseWriter, r *http.Request) {
	_, out, ok := a.stores(w)
	if !ok {
		return
	}
	var req requeueRequest
	if err := readBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if req.AllParked == (len(req.IDs) > 0) {
		writeError(w, http.StatusBadRequest, errors.New(`give either "ids" (parked rows to requeue) or "allParked": true`))
		return
	}
	n, err := out.Requeue(r.Context(), req.IDs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	a.log.InfoContext(r.Context(), "admin: parked outbox rows requeued", "requeued", n, "ids", len(req.IDs), "all_parked", req.AllParked, "remote_addr", r.RemoteAddr)
	if n > 0 {
		a.b.WakeRelay()
	}
	writeJSON(w, http.StatusOK, map[string]int{"requeued": n})
}

type releaseRequest struct {
	MessageID    string `json:"messageId"`
	ConsumerType string `json:"consumerType"`
}

func (a *handler) inboxRelease(w http.ResponseWriter, r *http.Request) {
	in, _, ok := a.stores(w)
	if !ok {
		return
	}
	fr, ok := in.(forceReleaser)
	if !ok {
		writeError(w, http.StatusNotImplemented, fmt.Errorf("the bus's inbox store (%T) cannot release a lock without its token", in))
		return
	}
	var req releaseRequest
	if err := readBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if req.MessageID == "" || req.ConsumerType == "" {
		writeError(w, http.StatusBadRequest, errors.New(`"messageId" and "consumerType" are required`))
		return
	}
	released, err := fr.ForceRelease(r.Context(), inbox.Key{MessageID: req.MessageID, ConsumerType: req.ConsumerType})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if !released {
		writeError(w, http.StatusNotFound, fmt.Errorf("no locked, unprocessed inbox entry %s/%s", req.MessageID, req.ConsumerType))
		return
	}
	a.log.InfoContext(r.Context(), "admin: inbox lock released", "message_id", req.MessageID, "consumer_type", req.ConsumerType, "remote_addr", r.RemoteAddr)
	writeJSON(w, http.StatusOK, map[string]int{"released": 1})
}

// forceReleaser is what inbox/release needs beyond inbox.Store: dropping a
// lock whatever its token (inbox.Store's Release needs the holder's).
type forceReleaser interface {
	ForceRelease(ctx context.Context, key inbox.Key) (bool, error)
}

// The bus's inbox store is gormstore's.
var _ forceReleaser = (*gormstore.Inbox)(nil)
