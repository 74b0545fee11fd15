package main

import (
	"context"
	"log/slog"
	mrand "math/rand/v2"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/pgtransport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// relayRole is a stand-alone outbox relay: an outbox.Relay over the run's
// outbox table and a RabbitMQ transport of its own. It exists besides the
// relay every started bus runs because the bus offers no hook between the
// broker's confirm and the marking of the rows; this relay's store wrapper
// provides one (see crashingStore).
type relayRole struct {
	cfg       *config
	db        *gorm.DB
	log       *slog.Logger
	delivered atomic.Int64
}

// newTransport builds the relay's transport: a RabbitMQ connection of its
// own, or the PostgreSQL transport on the run's tables. (On the latter the
// workload's publishes never reach the outbox, so the relay finds nothing
// to deliver; it is still a correct relay.) It declares no endpoints. The
// relay's lease bounds RabbitMQ's publish timeout, as on a bus's relay.
func (r *relayRole) newTransport() (transport.Transport, error) {
	env := transport.Env{Logger: r.log, RelayLease: r.cfg.RelayLease}
	if r.cfg.Transport == transportPostgres {
		return pgtransport.New(r.db, func(c *pgtransport.Config) {
			c.TablePrefix = r.cfg.Names.TransportPrefix()
			c.Lease = r.cfg.PGLease
			c.PollInterval = r.cfg.PollingInterval
			c.DisableAutoMigrate = true
		}).Build(env)
	}
	if isWatermill(r.cfg.Transport) {
		f, err := r.cfg.watermillFactory(func(*endpoint.Endpoints) {})
		if err != nil {
			return nil, err
		}
		return f.Build(env)
	}
	return rabbitmq.New(r.cfg.AMQPURL, nil).Build(env)
}

func (r *relayRole) run(ctx context.Context, ready func()) error {
	tr, err := r.newTransport()
	if err != nil {
		return err
	}
	defer func() { _ = tr.Close() }()
	if err := tr.Start(ctx, nil); err != nil {
		return err
	}
	st, err := gormstore.New(r.db, gormstore.WithTablePrefix(r.cfg.Names.Prefix))
	if err != nil {
		return err
	}
	// A transport that writes to the database (the PostgreSQL transport)
	// gets leased batches, as a bus's relay does: a held batch would keep
	// a pool connection its delivery needs.
	_, leased := tr.(transport.TxDeliverer)
	relay := &outbox.Relay{
		Store:           &crashingStore{Store: st.Outbox(), leased: leased, p: r.cfg.KillAfterConfirm, log: r.log},
		Transport:       tr,
		Owner:           r.cfg.Instance + "/relay",
		PollingInterval: r.cfg.PollingInterval,
		Lease:           r.cfg.RelayLease,
		Notifier:        st.Outbox(),
		Logger:          r.log,
		OnDelivered:     func(msgs []*outbox.Message) { r.delivered.Add(int64(len(msgs))) },
	}
	ready()
	relay.Run(ctx)
	return nil
}

// crashingStore wraps the outbox store. With probability p per settled
// batch that has confirmed rows, it kills the process instead of settling:
// the relay settles a batch only after the transport reported its
// messages confirmed by the broker, so the process dies exactly between
// confirm and mark. On PostgreSQL the batch's rows are locked by its
// transaction and come back when the dead process's connection closes
// (elsewhere after the lease); another relay delivers them again, and the
// consumers' inboxes must absorb the repeats.
type crashingStore struct {
	outbox.Store
	leased bool // lease batches even when the store could hold them
	p      float64
	log    *slog.Logger
}

func (s *crashingStore) ClaimBatch(ctx context.Context, owner string, limit int, hold time.Duration) (outbox.Batch, error) {
	claim := outbox.ClaimBatch
	if s.leased {
		claim = outbox.ClaimLeased
	}
	b, err := claim(ctx, s.Store, owner, limit, hold)
	if err != nil {
		return nil, err
	}
	return crashingBatch{Batch: b, s: s}, nil
}

type crashingBatch struct {
	outbox.Batch
	s *crashingStore
}

func (b crashingBatch) Settle(ctx context.Context, st outbox.Settlement) error {
	if len(st.Delivered) > 0 && b.s.p > 0 && mrand.Float64() < b.s.p {
		// os.Stderr is unbuffered: the line is out before the signal.
		b.s.log.Warn(msgKillAfterConfirm, "rows", len(st.Delivered), "detail", "the broker confirmed this batch; killing the process before the rows are marked delivered")
		killSelf()
	}
	return b.Batch.Settle(ctx, st)
}
