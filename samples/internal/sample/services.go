//go:build !embedded

package sample

import (
	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmamqp"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmnats"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmredis"
)

// This file links the transports and the PostgreSQL driver; a build with
// -tags embedded leaves it out (see Flags.Options).
func init() { services = serviceOptions }

func serviceOptions(f Flags, kind string, declare func(*endpoint.Endpoints)) ([]bus.Option, error) {
	if kind == TransportPostgres {
		db, err := postgresdb.Open(f.PostgresDSN)
		if err != nil {
			return nil, err
		}
		// No WithDatabase: the inbox and outbox live in the transport's
		// database, so PublishTx writes straight to the queue.
		return []bus.Option{bus.WithTransport(pgtransport.New(db, func(c *pgtransport.Config) { declare(&c.Endpoints) }))}, nil
	}
	var opts []bus.Option
	switch kind {
	case TransportRabbitMQ:
		opts = append(opts, bus.WithTransport(rabbitmq.New(f.AMQPURL, func(c *rabbitmq.Config) { declare(&c.Endpoints) })))
	case TransportWMAMQP:
		opts = append(opts, bus.WithTransport(wmamqp.New(f.AMQPURL, func(c *wmamqp.Config) { declare(&c.Endpoints) })))
	case TransportNATS:
		opts = append(opts, bus.WithTransport(wmnats.New(f.NATSURL, func(c *wmnats.Config) { declare(&c.Endpoints) })))
	case TransportRedis:
		opts = append(opts, bus.WithTransport(wmredis.New(f.RedisAddr, func(c *wmredis.Config) { declare(&c.Endpoints) })))
	default:
		opts = append(opts, bus.WithTransport(inproc.New(func(c *inproc.Config) { declare(&c.Endpoints) })))
	}
	if f.PostgresDSN != "" {
		db, err := postgresdb.Open(f.PostgresDSN)
		if err != nil {
			return nil, err
		}
		opts = append(opts, bus.WithDatabase(db))
	}
	return opts, nil
}
