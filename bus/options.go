package bus

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// ErrInvalidOption is wrapped by every error an option reports.
var ErrInvalidOption = errors.New("bus: invalid option")

// Option configures a Bus. Options validate their input; New returns every
// problem found, joined.
type Option func(*config) error

type transportKind int

const (
	transportInMemory transportKind = iota
	transportRabbitMQ
	transportPostgres
)

type config struct {
	transport      transportKind
	amqpURL        string
	rabbit         *endpoint.RabbitMQ
	endpoints      []*endpoint.Endpoints
	db             *gorm.DB
	sqlitePath     string
	outboxOpts     outbox.Options
	logger         *slog.Logger
	serializer     endpoint.Serializer
	instanceID     string
	stopTimeout    time.Duration
	maxMessageSize int
	errs           []error
	telemetry      telemetryConfig // telemetry.go
	health         healthConfig    // health.go
	clock          Clock           // clock.go; nil: the database's clock
}

func optErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithRabbitMQ selects RabbitMQ as the transport. url is an amqp:// or
// amqps:// URI with credentials and vhost; configure declares receive
// endpoints and topology and sets connection options.
func WithRabbitMQ(url string, configure func(r *endpoint.RabbitMQ)) Option {
	return func(c *config) error {
		if url == "" {
			return optErr("WithRabbitMQ: empty URL; pass amqp://user:password@host:5672/vhost")
		}
		if c.transport != transportInMemory {
			return optErr("WithRabbitMQ: a transport is already chosen; give one of WithRabbitMQ and WithPostgresTransport, once")
		}
		r := &endpoint.RabbitMQ{}
		if configure != nil {
			configure(r)
		}
		c.transport = transportRabbitMQ
		c.amqpURL = url
		c.rabbit = r
		c.endpoints = append(c.endpoints, &r.Endpoints)
		return nil // connection settings are validated by the transport in New
	}
}

// WithEndpoints declares receive endpoints on whichever transport the bus
// uses (the embedded default when no transport option is given).
func WithEndpoints(declare func(e *endpoint.Endpoints)) Option {
	return func(c *config) error {
		if declare == nil {
			return optErr("WithEndpoints: declare function is nil")
		}
		eps := &endpoint.Endpoints{}
		declare(eps)
		c.endpoints = append(c.endpoints, eps)
		return nil
	}
}

// ReceiveEndpoint declares one receive endpoint on whichever transport the
// bus uses. It is shorthand for WithEndpoints.
func ReceiveEndpoint(name string, configure func(e *endpoint.Endpoint)) Option {
	return WithEndpoints(func(e *endpoint.Endpoints) { e.ReceiveEndpoint(name, configure) })
}

// WithOutbox stores the outbox and inbox tables in db (PostgreSQL or SQLite
// through GORM) and applies configure to their options. Without it the bus
// uses an embedded SQLite database (in memory, or WithSQLite's file).
func WithOutbox(db *gorm.DB, configure func(o *outbox.Options)) Option {
	return func(c *config) error {
		if db == nil {
			return optErr("WithOutbox: db is nil; pass a *gorm.DB opened with gorm.io/driver/postgres or github.com/glebarez/sqlite")
		}
		c.db = db
		if configure != nil {
			configure(&c.outboxOpts)
		}
		return nil
	}
}

// WithOutboxOptions changes the outbox and inbox options without choosing a
// database (useful with the embedded default).
func WithOutboxOptions(configure func(o *outbox.Options)) Option {
	return func(c *config) error {
		if configure == nil {
			return optErr("WithOutboxOptions: configure is nil")
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
