package bus

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// ErrInvalidOption is wrapped by every error an option reports.
var ErrInvalidOption = errors.New("bus: invalid option")

// Option configures a Bus. Options validate their input; New returns every
// problem found, joined.
type Option func(*config) error

type config struct {
	factory        transport.Factory // nil: the embedded in-process transport
	db             *gorm.DB
	sqlitePath     string
	outboxOpts     outbox.Options
	logger         *slog.Logger
	serializer     endpoint.Serializer
	instanceID     string
	stopTimeout    time.Duration
	maxMessageSize int
	errs           []error
	telemetry      telemetryConfig                   // telemetry.go
	health         healthConfig                      // health.go
	clock          Clock                             // clock.go; nil: the database's clock
	orderingKeys   map[reflect.Type]func(any) string // ordering.go
}

func optErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithTransport chooses the transport and declares its receive endpoints:
// pass the value of a transport package's New, whose configuration block
// declares the endpoints with ReceiveEndpoint:
//
//	bus.WithTransport(rabbitmq.New(url, func(c *rabbitmq.Config) {
//		c.ReceiveEndpoint("orders", func(e *endpoint.Endpoint) { ... })
//	}))
//
// This is the one way to declare receive endpoints. Without it the bus
// runs on the embedded in-process transport with no endpoints; to consume
// on it, pass inproc.New with its block. Give it once.
func WithTransport(f transport.Factory) Option {
	return func(c *config) error {
		if f == nil || (reflect.ValueOf(f).Kind() == reflect.Pointer && reflect.ValueOf(f).IsNil()) {
			return optErr("WithTransport: transport is nil; pass rabbitmq.New, pgtransport.New or inproc.New")
		}
		if c.factory != nil {
			return optErr("WithTransport given twice; a bus has one transport")
		}
		c.factory = f
		return nil
	}
}

// WithDatabase keeps the outbox and inbox tables in db (PostgreSQL or SQLite
// through GORM), so that consumers' writes and what they publish commit in
// one transaction with those tables. Without it the bus uses the database
// of its transport when it has one (pgtransport), else an embedded SQLite
// database (in memory, or WithSQLite's file).
func WithDatabase(db *gorm.DB) Option {
	return func(c *config) error {
		if db == nil {
			return optErr("WithDatabase: db is nil; pass a *gorm.DB opened with gorm.io/driver/postgres or github.com/glebarez/sqlite")
		}
		if c.db != nil {
			return optErr("WithDatabase given twice")
		}
		c.db = db
		return nil
	}
}

// WithOutbox changes the outbox and inbox options (polling, batch sizes,
// retention, lock timeout, table prefix, ...) on whichever database the bus
// uses. It may be given more than once; each configure runs in turn.
func WithOutbox(configure func(o *outbox.Options)) Option {
	return func(c *config) error {
		if configure == nil {
			return optErr("WithOutbox: configure is nil")
		}
		configure(&c.outboxOpts)
		return nil
	}
}

// WithSQLite makes the embedded default keep its tables in the SQLite file
// at path instead of in memory.
func WithSQLite(path string) Option {
	return func(c *config) error {
		if path == "" {
			return optErr("WithSQLite: empty path (omit the option for an in-memory database)")
		}
		c.sqlitePath = path
		return nil
	}
}

// WithLogger sets the logger. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return optErr("WithLogger: logger is nil")
		}
		c.logger = l
		return nil
	}
}

// WithSerializer sets how published messages are serialized. Defaults to
// endpoint.JSON.
func WithSerializer(s endpoint.Serializer) Option {
	return func(c *config) error {
		if s == nil {
			return optErr("WithSerializer: serializer is nil")
		}
		c.serializer = s
		return nil
	}
}

// WithInstanceID names this process in relay leases and logs. Defaults to
// host name, process id and a random suffix.
func WithInstanceID(id string) Option {
	return func(c *config) error {
		if id == "" {
			return optErr("WithInstanceID: empty id")
		}
		c.instanceID = id
		return nil
	}
}

// WithStopTimeout bounds how long Run waits for in-flight messages when its
// context ends. Defaults to 30s.
func WithStopTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return optErr("WithStopTimeout: %v must be positive", d)
		}
		c.stopTimeout = d
		return nil
	}
}

// WithMaxMessageSize caps a serialized message body; larger publishes fail
// with ErrMessageTooLarge. Defaults to 16 MiB (RabbitMQ 4's own limit).
func WithMaxMessageSize(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return optErr("WithMaxMessageSize: %d must be positive", n)
		}
		c.maxMessageSize = n
		return nil
	}
}
