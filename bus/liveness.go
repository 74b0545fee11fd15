package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v5"

	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/pgerr"
)

// ErrTransactionAborted is the fault of a consumer that returned nil but
// left its PostgreSQL transaction aborted: one of its statements failed
// (say a duplicate-key insert) and the error was ignored, so nothing it did
// can commit (SQLSTATE 25P02). It is the consumer's failure: the message is
// retried per the endpoint's policy and then dead-lettered with this reason.
var ErrTransactionAborted = errors.New("consumer returned nil but left its transaction aborted: one of its statements failed and the error was ignored (SQLSTATE 25P02); nothing it did was committed")

// ErrInvalidMessageID is the dead-letter reason for a received message whose
// id cannot be an inbox key: over maxInboundIDLen bytes, or with a NUL byte
// or invalid UTF-8 (raw GUID bytes, say), which PostgreSQL cannot store.
var ErrInvalidMessageID = errors.New("message id cannot be deduplicated")

// outcome is what one attempt's error means for the delivery.
type outcome int

const (
	outcomeOK       outcome = iota
	outcomeShutdown         // the bus is stopping (or the wait for a busy entry ended): hand back
	outcomeLockLost         // another delivery took the inbox lock over: look again, uncounted
	outcomeOutage           // the database is down: pause, then try again, uncounted
	outcomeFailed           // the consumer's failure (or this message's): counted, retried per policy
)

// classify decides what an attempt's error means, by what failed: an error
// from the framework's own statements (an inbox.StoreError) with a
// connection-class cause is an outage; any other failure is charged to the
// delivery unless a probe of the database says it is down. The Go type of
// a consumer's error decides nothing: a consumer's wrapped *url.Error or
// context.DeadlineExceeded is the consumer's failure.
func (b *Bus) classify(ctx context.Context, err error) (outcome, error) {
	switch {
	case err == nil:
		return outcomeOK, nil
	case errors.Is(err, inbox.ErrBusy), errors.Is(err, errHandBack), ctx.Err() != nil:
		return outcomeShutdown, err
	case errors.Is(err, inbox.ErrLockLost):
		return outcomeLockLost, err
	}
	var se *inbox.StoreError
	if errors.As(err, &se) {
		if abortedTx(se.Err) {
			return outcomeFailed, fmt.Errorf("%w: %v", ErrTransactionAborted, se)
		}
		if connectionClass(se.Err) {
			return outcomeOutage, err
		}
	}
	if b.probeDatabase(ctx) != nil {
		return outcomeOutage, err
	}
	return outcomeFailed, err
}

// abortedTx reports whether a statement or commit of the framework's failed
// because the transaction was already aborted by an earlier failed
// statement (the consumer's).
func abortedTx(err error) bool {
	return pgerr.IsCommitRollback(err) || pgerr.SQLState(err) == "25P02"
}

// connectionClass reports whether err, returned by one of the framework's
// own statements, says the connection to the database failed. Only ever
// applied to the framework's statements: a consumer's network error is the
// consumer's.
func connectionClass(err error) bool { return pgerr.ConnectionClass(err) }

// probeTimeout bounds one database probe: a database that does not answer
// a ping within it counts as down.
const probeTimeout = 2 * time.Second

// probeDatabase pings the bus's database with a fresh deadline.
func (b *Bus) probeDatabase(ctx context.Context) error {
	if b.db == nil {
		return nil
	}
	sqlDB, err := b.db.DB()
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	return sqlDB.PingContext(pctx)
}

// dbGate pauses consumption while the database is down. The first delivery
// that sees the outage closes the gate and starts one prober; every
// delivery waits at the gate (holding its message unacknowledged, so the
// broker counts no redelivery) until a probe succeeds. One warning when the
// outage starts, one line when it ends.
type dbGate struct {
	b   *Bus
	log *slog.Logger

	mu      sync.Mutex
	open    chan struct{} // closed while the database is up
	since   time.Time     // when the current outage started; zero when up
	cause   string
	outages int64
	stop    chan struct{}
}

func newDBGate(b *Bus, log *slog.Logger) *dbGate {
	open := make(chan struct{})
	close(open)
	return &dbGate{b: b, log: log, open: open, stop: make(chan struct{})}
}

// wait returns at once while the database is up; during an outage it
// blocks until the database answers again, ctx ends or the bus stops.
func (g *dbGate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	default:
	}
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-g.stop:
		return errHandBack
	}
}

// stopping is closed when Stop begins: waits for the database or for a
// transport to take a dead letter end then (the consumer's own work does
// not: Stop drains it).
func (g *dbGate) stopping() <-chan struct{} { return g.stop }

// down closes the gate (if it is open) and starts probing.
func (g *dbGate) down(ctx context.Context, cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.since.IsZero() {
		return
	}
	g.since = time.Now()
	g.cause = cause.Error()
	g.outages++
	g.open = make(chan struct{})
	g.log.WarnContext(ctx, "database unavailable; consumption paused until it answers", "error", cause)
	g.b.tel.outage(ctx, true)
	go g.probe()
}

func (g *dbGate) probe() {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = 5 * time.Second
	for {
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-g.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if g.b.probeDatabase(context.Background()) == nil {
			break
		}
	}
	g.mu.Lock()
	d := time.Since(g.since)
	g.since, g.cause = time.Time{}, ""
	close(g.open)
	g.mu.Unlock()
	g.log.Info("database available again; consumption resumed", "outage", d.Round(time.Millisecond))
	g.b.tel.outage(context.Background(), false)
}

// state reports the current outage, if any.
func (g *dbGate) state() (since time.Time, cause string, outages int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.since, g.cause, g.outages
}

// close ends a running prober (at Stop); deliveries waiting at the gate end
// with their own contexts.
func (g *dbGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
}

// checkInboundID returns why a received message's id cannot be an inbox
// key, or nil. An empty id is the endpoint's MissingMessageID policy's.
func checkInboundID(id string) error {
	switch {
	case len(id) > maxInboundIDLen:
		return fmt.Errorf("%w: it is %d bytes; ids of at most %d bytes can be deduplicated", ErrInvalidMessageID, len(id), maxInboundIDLen)
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: it contains a NUL byte (%s)", ErrInvalidMessageID, quoteID(id))
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: it is not valid UTF-8 (%s)", ErrInvalidMessageID, quoteID(id))
	}
	return nil
}

// quoteID shows a bad id in a log line or header: ASCII only, at most
// about 200 bytes.
func quoteID(id string) string {
	if len(id) > 96 {
		id = id[:96]
	}
	return strconv.QuoteToASCII(id)
}

// storableID returns id when every transport and database can carry it,
// else a stable stand-in derived from its bytes, so that the dead letter of
// a message with a bad id can itself be stored and deduplicated.
func storableID(id string) string {
	if id == "" || checkInboundID(id) == nil {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "bw-invalid-id-" + hex.EncodeToString(sum[:16])
}
