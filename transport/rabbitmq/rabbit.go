package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

var (
	_ transport.Transport   = (*Transport)(nil)
	_ transport.ReplyQueues = (*Transport)(nil)
)

// errClosed is returned by operations on a closed transport.
var errClosed = errors.New("rabbitmq: transport is closed")

// dialTimeout bounds one TCP + TLS + AMQP handshake attempt.
const dialTimeout = 15 * time.Second

// Transport is the RabbitMQ transport. Create it with New, then Start it.
type Transport struct {
	url    string    // New's argument, as given
	addrs  addresses // every broker address, in the order to try them
	secret secret    // hides the password of every address
	cfg    Config
	log    *slog.Logger

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // supervisor and subscriptions

	mu        sync.Mutex
	conn      *amqp.Connection // nil while disconnected
	ready     chan struct{}    // closed while conn is usable
	started   bool
	closed    bool
	endpoints []*endpoint.Endpoint
	byName    map[string]*endpoint.Endpoint
	replies   []string                  // reply queues, declared again after a reconnect
	consumers map[string]*queueConsumer // by queue: the one consumer its handlers share
	blocked   atomic.Pointer[string]    // reason while the broker blocks publishing
	connects  atomic.Int64              // connections made: 1 + reconnects
	node      atomic.Int32              // index in addrs of the current (or last) connection
	dialErr   atomic.Pointer[string]    // the last failed reconnect attempt, redacted; nil once connected
	downSince atomic.Int64              // unix nanoseconds when the connection was lost; 0 while connected

	// The suspect window (Config.SuspectWindow): lastSignal is the time of
	// the latest failure signal of the connection, as nanoseconds since
	// epoch plus one (0: none yet); destSignals holds the same for a nack,
	// by destination (a destination, an int64); anySignal is set by either.
	// epoch carries the monotonic clock.
	epoch       time.Time
	lastSignal  atomic.Int64
	destSignals sync.Map
	anySignal   atomic.Bool

	exMu      sync.Mutex
	exchanges map[string]bool // exchanges known to exist on the current connection

	pubMu      sync.Mutex
	pub        *publisher
	pubOpening *pubOpen // an open of pub in progress (getPublisher)
	pubClosed  bool
	pubWG      sync.WaitGroup // publisher confirm handlers
}

// New returns the RabbitMQ transport for url (amqp:// or amqps://, with
// credentials and vhost), to hand to bus.WithTransport. For a cluster, url
// may list several nodes' URLs separated by commas, or Config.URLs may add
// them: the transport connects to the first that answers and, when it loses
// that node, to the next one (see Config.URLs). configure declares
// the receive endpoints and extra topology and sets connection options; it
// runs once, now. New does no I/O and reports nothing: the bus's New
// reports every mistake (the URL's included) when it builds the transport.
// A Transport serves one bus.
func New(url string, configure func(c *Config)) *Transport {
	t := &Transport{url: url}
	if configure != nil {
		configure(&t.cfg)
	}
	return t
}

// Endpoints returns the receive endpoints declared in New's block.
func (t *Transport) Endpoints() *endpoint.Endpoints { return &t.cfg.Endpoints }

// System names the transport for telemetry: "rabbitmq".
func (t *Transport) System() string { return "rabbitmq" }

// Build validates the configuration against env (the relay's lease bounds
// PublishTimeout) and readies the transport; it does no I/O. It may be
// called again until the transport is started (a bus.New that failed can
// be retried with the same transport); the last call counts.
func (t *Transport) Build(env transport.Env) (transport.Transport, error) {
	t.mu.Lock()
	started := t.started
	t.mu.Unlock()
	if started {
		return nil, errBuilt
	}
	if t.cancel != nil {
		t.cancel() // built before by a New that failed: build afresh
	}
	addrs, err := parseAddresses(t.url, t.cfg.URLs)
	errs := t.cfg.check()
	if err != nil {
		errs = append(errs, err)
	}
	c := t.cfg.withDefaults(env.RelayLease)
	if err := leaseCheck(env.RelayLease, c.PublishTimeout); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	logger := env.Logger
	if logger == nil {
		logger = slog.Default()
	}
	t.addrs = addrs
	t.secret = addrs.all
	t.node.Store(0)
	t.cfg = c
	t.epoch = time.Now()
	t.lastSignal.Store(0)
	t.destSignals.Clear()
	t.anySignal.Store(false)
	t.log = logger.With(slog.String("transport", "rabbitmq"))
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.ready = make(chan struct{})
	t.byName = map[string]*endpoint.Endpoint{}
	t.consumers = map[string]*queueConsumer{}
	t.exchanges = map[string]bool{}
	return t, nil
}

// secret knows how to hide the credentials of one URL.
type secret struct {
	redacted string // the URL with its password replaced by xxxxx
	replace  []string
}

// scrub removes the URL's password from s.
func (s secret) scrub(str string) string {
	if len(s.replace) == 0 {
		return str
	}
	return strings.NewReplacer(s.replace...).Replace(str)
}

// scrubErr returns err with the password removed from its text; errors.Is
// and errors.As still see the original chain.
func (s secret) scrubErr(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if clean := s.scrub(msg); clean != msg {
		return &scrubbedError{msg: clean, err: err}
	}
	return err
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// parseURL validates an AMQP URL without ever printing its password.
func parseURL(raw string) (secret, error) {
	scheme, _, ok := strings.Cut(raw, "://")
	fallback := redactLoosely(raw)
	if !ok {
		return secret{}, fmt.Errorf("rabbitmq: invalid URL %q: want amqp://user:password@host:port/vhost or amqps://", fallback)
	}
	switch strings.ToLower(scheme) {
	case "amqp", "amqps":
	default:
		return secret{}, fmt.Errorf("rabbitmq: invalid URL %q: scheme %q is not amqp or amqps", fallback, scheme)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the whole URL in its error: never show it.
		return secret{}, fmt.Errorf("rabbitmq: invalid URL %q: cannot parse it (check the port, and percent-encode reserved characters in the user name and password)", fallback)
	}
	sec := secret{redacted: u.Redacted()}
	if u.User != nil {
		if pw, has := u.User.Password(); has && pw != "" {
			sec.replace = append(sec.replace, raw, sec.redacted)
			user := u.User.Username()
			sec.replace = append(sec.replace,
				u.User.String(), url.UserPassword(user, "xxxxx").String(),
				user+":"+pw, user+":xxxxx",
			)
			if len(pw) >= 4 {
				sec.replace = append(sec.replace, pw, "xxxxx")
				if esc := url.QueryEscape(pw); esc != pw {
					sec.replace = append(sec.replace, esc, "xxxxx")
				}
			}
		}
	}
	if u.Host == "" || u.Hostname() == "" {
		return secret{}, fmt.Errorf("rabbitmq: invalid URL %q: no host", sec.redacted)
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		return secret{}, fmt.Errorf("rabbitmq: invalid URL %q: %s", sec.redacted, sec.scrub(err.Error()))
	}
	return sec, nil
}

// redactLoosely hides everything between "://" and the last "@" of a string
// that may not parse as a URL.
func redactLoosely(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		if i := strings.LastIndex(raw, "@"); i >= 0 {
			return "xxxxx" + raw[i:]
		}
		return raw
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		return scheme + "://xxxxx" + rest[i:]
	}
	return raw
}

// Connects returns how many connections the transport has made: 1 after
// Start, one more per reconnect.
func (t *Transport) Connects() int64 { return t.connects.Load() }

// DropConnection closes the current connection the way a network failure
// ends it (for tests): the supervisor reconnects, consumers subscribe again
// and the broker redelivers what was not acknowledged.
func (t *Transport) DropConnection() error {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c == nil || c.IsClosed() {
		return fmt.Errorf("rabbitmq: DropConnection: not connected (last node %s)", t.URL())
	}
	return c.CloseDeadline(time.Now().Add(closeTimeout))
}

// URL returns the URL of the broker node the transport is connected to
// (or was connected to last, or will try first), with its password
// redacted. "" before the transport is built.
func (t *Transport) URL() string {
	i := int(t.node.Load())
	if i >= len(t.addrs.secrets) {
		return ""
	}
	return t.addrs.secrets[i].redacted
}

// URLs returns every broker address, in the order given, with passwords
// redacted.
func (t *Transport) URLs() []string { return t.addrs.redacted() }

// Node returns the URL (password redacted) of the broker node the
// transport is connected to, or "" while it is disconnected.
func (t *Transport) Node() string {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c == nil || c.IsClosed() {
		return ""
	}
	return t.URL()
}

// HealthDetails reports the node the transport is connected to ("node",
// "" while disconnected), every address it may use ("addresses"), how
// many connections it has made ("connects") and, after it lost its
// connection and until it has a new one, for how long it has had none
// ("disconnectedForSeconds"), for bus.CheckHealth.
func (t *Transport) HealthDetails() map[string]any {
	d := map[string]any{"node": t.Node(), "addresses": t.URLs(), "connects": t.Connects()}
	if down := t.disconnectedFor(); down > 0 {
		d["disconnectedForSeconds"] = down.Seconds()
	}
	return d
}

// disconnectedFor is how long the transport has been without a connection
// since it lost one (0 while connected, and before the first connection).
func (t *Transport) disconnectedFor() time.Duration {
	since := t.downSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// Start connects, retrying a broker that is down with exponential backoff
// for up to cfg.ConnectTimeout, declares the topology the endpoints need and
// starts the reconnect supervisor. It may be called again after it failed.
func (t *Transport) Start(ctx context.Context, endpoints []*endpoint.Endpoint) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errClosed
	}
	if t.ctx == nil {
		t.mu.Unlock()
		return errNotBuilt
	}
	if t.started {
		t.mu.Unlock()
		return errors.New("rabbitmq: transport already started")
	}
	t.started = true
	t.endpoints = t.endpoints[:0]
	t.byName = make(map[string]*endpoint.Endpoint, len(endpoints))
	for _, ep := range endpoints {
		if ep != nil {
			t.endpoints = append(t.endpoints, ep)
			t.byName[ep.Name()] = ep
		}
	}
	t.mu.Unlock()

	fail := func(err error) error {
		t.mu.Lock()
		t.started = false
		t.mu.Unlock()
		return err
	}

	conn, notes, err := t.connectWithRetry(ctx)
	if err != nil {
		return fail(err)
	}
	if err := t.declareTopology(conn); err != nil {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return fail(err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return errClosed
	}
	t.setUpLocked(conn)
	t.wg.Add(1)
	t.mu.Unlock()
	go t.supervise(notes)
	t.log.Info("rabbitmq connected", slog.String("url", t.URL()), slog.Int("endpoints", len(endpoints)))
	return nil
}

// connNotes are the notification channels registered on one connection.
type connNotes struct {
	closed  chan *amqp.Error
	blocked chan amqp.Blocking
}

// connectWithRetry dials until it succeeds, the connect timeout expires, ctx
// is done or the transport is closed. Each attempt tries every address in
// turn; attempts are spaced by exponential backoff; the last one is made
// just before the deadline.
func (t *Transport) connectWithRetry(ctx context.Context) (*amqp.Connection, connNotes, error) {
	timeout := t.cfg.ConnectTimeout
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()
	deadline, _ := ctx.Deadline()

	b := &backoff.ExponentialBackOff{
		InitialInterval:     100 * time.Millisecond,
		RandomizationFactor: 0.3,
		Multiplier:          2,
		MaxInterval:         min(t.cfg.ReconnectMaxInterval, 5*time.Second),
	}
	b.Reset()
	var lastErr *dialErrors
	attempts := 0
	for {
		attempts++
		conn, notes, derr := t.dialAny(ctx, 0)
		if derr == nil {
			return conn, notes, nil
		}
		if lastErr == nil || ctx.Err() == nil {
			lastErr = derr // keep the dial errors, not the cancellation that cut an attempt
		}
		if derr.hopeless() {
			break // wrong credentials, untrusted certificate: retrying will not help
		}
		// The last attempt starts a little before the deadline, so that it
		// can fail with its own error rather than with the deadline's.
		remaining := time.Until(deadline) - 50*time.Millisecond
		if ctx.Err() != nil || remaining <= 0 {
			break
		}
		next := min(b.NextBackOff(), remaining)
		t.log.Warn("rabbitmq connect failed, retrying",
			slog.Any("urls", t.URLs()),
			slog.Int("attempt", attempts),
			slog.Duration("retry_in", next),
			slog.String("error", t.secret.scrub(derr.Error())))
		select {
		case <-ctx.Done():
		case <-time.After(next):
		}
		if t.ctx.Err() != nil {
			break
		}
	}
	if t.ctx.Err() != nil {
		return nil, connNotes{}, errClosed
	}
	if len(t.addrs.urls) == 1 {
		return nil, connNotes{}, fmt.Errorf("rabbitmq: cannot connect to %s after %d attempt(s) (connect timeout %v): %w",
			t.addrs.secrets[0].redacted, attempts, timeout, t.secret.scrubErr(lastErr))
	}
	return nil, connNotes{}, fmt.Errorf("rabbitmq: cannot connect to any of %d broker addresses (%s) after %d attempt(s) each (connect timeout %v): %w",
		len(t.addrs.urls), strings.Join(t.URLs(), ", "), attempts, timeout, t.secret.scrubErr(lastErr))
}

// dialAny tries every address once, starting at index start, and returns
// the first connection made; it records which address answered.
func (t *Transport) dialAny(ctx context.Context, start int) (*amqp.Connection, connNotes, *dialErrors) {
	derr := &dialErrors{}
	for _, i := range t.addrs.order(start) {
		conn, notes, err := t.dial(ctx, i)
		if err == nil {
			t.node.Store(int32(i))
			return conn, notes, nil
		}
		derr.addrs = append(derr.addrs, t.addrs.secrets[i].redacted)
		derr.errs = append(derr.errs, t.secret.scrubErr(err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, connNotes{}, derr
}

// hopeless reports whether every address refused for a reason that
// retrying cannot fix: wrong credentials or an untrusted certificate.
func (e *dialErrors) hopeless() bool {
	for _, err := range e.errs {
		var aerr *amqp.Error
		var cerr *tls.CertificateVerificationError
		if !(errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused) && !errors.As(err, &cerr) {
			return false
		}
	}
	return len(e.errs) > 0
}

// dial makes one connection attempt to address i, bounded by ctx and
// dialTimeout.
func (t *Transport) dial(ctx context.Context, i int) (*amqp.Connection, connNotes, error) {
	if err := ctx.Err(); err != nil {
		return nil, connNotes{}, err
	}
	url := t.addrs.urls[i]
	deadline := time.Now().Add(dialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	props := amqp.NewConnectionProperties()
	host, _ := os.Hostname()
	props.SetClientConnectionName(fmt.Sprintf("barewire %s pid %d", host, os.Getpid()))
	cfg := amqp.Config{
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Deadline: deadline}
			raw, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			conn := &writeBounded{Conn: raw, timeout: t.writeTimeout()} // bound.go
			// Bounds the TLS and AMQP handshakes; amqp091 clears it after.
			if err := conn.SetDeadline(deadline); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return conn, nil
		},
	}
	if t.cfg.TLS != nil && strings.HasPrefix(strings.ToLower(url), "amqps://") {
		// Without cfg.TLS, amqp091 builds the TLS config from the URL
		// (cacertfile, certfile, keyfile, server_name_indication).
		cfg.TLSClientConfig = t.cfg.TLS.Clone()
	}
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil {
		return nil, connNotes{}, err
	}
	notes := connNotes{
		closed:  conn.NotifyClose(make(chan *amqp.Error, 1)),
		blocked: conn.NotifyBlocked(make(chan amqp.Blocking, 4)),
	}
	return conn, notes, nil
}

// setUpLocked publishes conn as the current connection. t.mu must be held.
func (t *Transport) setUpLocked(conn *amqp.Connection) {
	t.conn = conn
	if t.connects.Add(1) > 1 || len(t.addrs.urls) > 1 {
		// A reconnect, or a cluster's first connection: this process may
		// have started during an election.
		t.suspect("connected")
	}
	t.blocked.Store(nil)
	t.dialErr.Store(nil)
	t.downSince.Store(0)
	select {
	case <-t.ready:
	default:
		close(t.ready)
	}
}

// setDown forgets the current connection.
func (t *Transport) setDown() {
	t.downSince.CompareAndSwap(0, time.Now().UnixNano())
	t.suspect("connection lost")
	t.mu.Lock()
	t.conn = nil
	select {
	case <-t.ready:
		t.ready = make(chan struct{})
	default:
	}
	t.mu.Unlock()
	t.forgetExchanges()
}

// supervise watches the connection and reconnects when it is lost.
func (t *Transport) supervise(notes connNotes) {
	defer t.wg.Done()
	for {
		var lost *amqp.Error
	watch:
		for {
			select {
			case <-t.ctx.Done():
				return
			case b, ok := <-notes.blocked:
				if !ok {
					notes.blocked = nil
					continue
				}
				if b.Active {
					reason := b.Reason
					t.blocked.Store(&reason)
					t.log.Warn("rabbitmq broker blocked publishing", slog.String("reason", b.Reason))
				} else {
					t.blocked.Store(nil)
					t.log.Info("rabbitmq broker unblocked publishing")
				}
			case e, ok := <-notes.closed:
				if ok {
					lost = e
				}
				break watch
			}
		}
		t.setDown()
		if t.ctx.Err() != nil {
			return
		}
		attrs := []any{slog.String("url", t.URL())}
		if lost != nil {
			attrs = append(attrs, slog.String("error", t.secret.scrub(lost.Error())))
		}
		t.log.Warn("rabbitmq connection lost, reconnecting", attrs...)
		var conn *amqp.Connection
		conn, notes = t.reconnect()
		if conn == nil {
			return
		}
	}
}

// reconnect dials with exponential backoff capped at ReconnectMaxInterval
// until it succeeds or the transport closes, then re-declares the topology.
// Each attempt tries every address once, starting with the one after the
// node just lost, so that a cluster's client fails over to another node at
// once; with one address it retries that one.
func (t *Transport) reconnect() (*amqp.Connection, connNotes) {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     100 * time.Millisecond,
		RandomizationFactor: 0.3,
		Multiplier:          2,
		MaxInterval:         t.cfg.ReconnectMaxInterval,
	}
	b.Reset()
	lost := int(t.node.Load())
	start := (lost + 1) % len(t.addrs.urls)
	for attempt := 1; ; attempt++ {
		wait := min(b.NextBackOff(), t.cfg.ReconnectMaxInterval)
		if attempt == 1 && len(t.addrs.urls) > 1 {
			wait = 0 // another node may well be up: fail over at once
		}
		select {
		case <-t.ctx.Done():
			return nil, connNotes{}
		case <-time.After(wait):
		}
		conn, notes, derr := t.dialAny(t.ctx, start)
		if derr != nil {
			if t.ctx.Err() != nil {
				return nil, connNotes{}
			}
			msg := t.secret.scrub(derr.Error())
			t.dialErr.Store(&msg)
			t.log.Warn("rabbitmq reconnect failed",
				slog.Any("urls", t.URLs()),
				slog.Int("attempt", attempt),
				slog.String("error", t.secret.scrub(derr.Error())))
			// The lost node comes back last in the next round too: it is
			// the least likely to answer.
			continue
		}
		if err := t.declareTopology(conn); err != nil {
			if conn.IsClosed() {
				t.log.Warn("rabbitmq connection lost while declaring topology", slog.String("url", t.URL()), slog.String("error", t.secret.scrub(err.Error())))
				start = (int(t.node.Load()) + 1) % len(t.addrs.urls)
				continue
			}
			// Keep the connection: what could be declared is usable, and
			// consumers of the rest keep retrying.
			t.log.Error("rabbitmq topology declaration failed after reconnect", slog.String("error", t.secret.scrub(err.Error())))
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
			return nil, connNotes{}
		}
		t.setUpLocked(conn)
		t.mu.Unlock()
		t.log.Info("rabbitmq reconnected", slog.String("url", t.URL()), slog.String("lost", t.addrs.secrets[lost].redacted), slog.Int("attempt", attempt))
		return conn, notes
	}
}

// currentConn returns the open connection or an error wrapping
// outbox.ErrTransportUnavailable, without waiting.
func (t *Transport) currentConn() (*amqp.Connection, error) {
	t.mu.Lock()
	c, closed, started := t.conn, t.closed, t.started
	t.mu.Unlock()
	switch {
	case closed:
		return nil, fmt.Errorf("%w: %w", outbox.ErrTransportUnavailable, errClosed)
	case !started:
		return nil, fmt.Errorf("%w: rabbitmq: transport not started", outbox.ErrTransportUnavailable)
	case c == nil || c.IsClosed():
		return nil, fmt.Errorf("%w: rabbitmq: not connected (reconnecting; addresses: %s)", outbox.ErrTransportUnavailable, strings.Join(t.URLs(), ", "))
	}
	return c, nil
}

// waitConn waits until a connection is usable.
func (t *Transport) waitConn(ctx context.Context) (*amqp.Connection, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, errClosed
		}
		c, ready := t.conn, t.ready
		t.mu.Unlock()
		if c != nil && !c.IsClosed() {
			return c, nil
		}
		if c != nil {
			// Closed, but the supervisor has not noticed yet.
			ready = nil
		}
		select {
		case <-ready:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.ctx.Done():
			return nil, errClosed
		}
	}
}

// Health reports nil while the connection is open. While the transport
// reconnects, its error names every address and, once a round of attempts
// has failed, each address's own error (passwords redacted).
func (t *Transport) Health(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := t.currentConn()
	if err != nil {
		if down := t.disconnectedFor(); down > 0 {
			err = fmt.Errorf("%w; no connection for %s", err, down.Round(100*time.Millisecond))
		}
		if last := t.dialErr.Load(); last != nil {
			return fmt.Errorf("%w; last attempt: %s", err, *last)
		}
	}
	return err
}

// Close stops every subscription (in-flight messages are requeued), fails
// publishes still waiting for a confirm and closes the connection. It waits
// for every goroutine the transport started.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed || t.cancel == nil {
		t.closed = true
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	// Subscriptions (which nack in-flight messages) and the supervisor.
	// A broker that stopped reading the connection leaves them waiting
	// on it: after closeTimeout the connection is closed under them.
	ended := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(closeTimeout):
		t.mu.Lock()
		conn := t.conn
		t.mu.Unlock()
		if conn != nil {
			t.log.Warn("rabbitmq subscriptions did not end in time: closing the connection under them", slog.Duration("waited", closeTimeout))
			abandon(conn)
		}
		<-ended
	}

	t.pubMu.Lock()
	t.pubClosed = true
	t.pub = nil // its channel closes with the connection
	t.pubMu.Unlock()

	t.mu.Lock()
	conn := t.conn
	t.conn = nil
	t.mu.Unlock()
	var err error
	if conn != nil && !conn.IsClosed() {
		// Bounded: a broker that stopped reading never sends close-ok.
		if cerr := conn.CloseDeadline(time.Now().Add(closeTimeout)); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) && !isTimeout(cerr) {
			err = t.secret.scrubErr(cerr)
		}
	}
	t.pubWG.Wait()
	t.log.Info("rabbitmq transport closed")
	return err
}

// forgetExchanges clears the cache of exchanges known to exist.
func (t *Transport) forgetExchanges() {
	t.exMu.Lock()
	clear(t.exchanges)
	t.exMu.Unlock()
}

func (t *Transport) knownExchange(name string) bool {
	t.exMu.Lock()
	defer t.exMu.Unlock()
	return t.exchanges[name]
}

func (t *Transport) rememberExchange(name string) {
	t.exMu.Lock()
	t.exchanges[name] = true
	t.exMu.Unlock()
}
