package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/reliability/workload"
)

// errRollback makes a producer transaction roll back on purpose.
var errRollback = errors.New("testsvc: deliberate rollback")

// producer publishes orders through the outbox, each in a transaction that
// also writes a produced row: the checker then expects exactly the produced
// ids to have effects. A fraction of transactions roll back (their ids are
// recorded afterwards, outside the transaction) and a fraction re-publish an
// id that already committed, with the same message-id header.
type producer struct {
	cfg *config
	b   *bus.Bus
	db  *gorm.DB
	log *slog.Logger
	// tag makes this incarnation's ids unique: a restarted producer never
	// reuses an id for a different message.
	tag string
	seq atomic.Int64

	committed, rolledBack, republished, failed atomic.Int64
	// poisonSent and poisonRefused count poison messages by outcome.
	poisonSent, poisonRefused atomic.Int64
	raw                       *rawSender

	mu   sync.Mutex
	sent []workload.Order // committed orders, for re-publishing
	pace *pacer
}

func newProducer(cfg *config, b *bus.Bus, db *gorm.DB, log *slog.Logger) *producer {
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	p := &producer{cfg: cfg, b: b, db: db, log: log, tag: hex.EncodeToString(raw[:]), pace: newPacer(cfg.Rate)}
	if cfg.PoisonRatio > 0 && cfg.Transport == transportRabbitMQ {
		p.raw = &rawSender{url: cfg.AMQPURL} // dials on first use
	}
	return p
}

// run produces until the produced table holds cfg.Messages rows (ids
// committed by earlier incarnations count), then returns.
func (p *producer) run(ctx context.Context) error {
	var have int64
	for {
		err := p.db.WithContext(ctx).Raw(`SELECT count(*) FROM ` + p.cfg.Names.Table(workload.TableProduced)).Scan(&have).Error
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Warn("producer: counting produced rows failed; retrying", "error", err)
		sleep(ctx, time.Second)
	}
	defer p.raw.close()
	remaining := int64(p.cfg.Messages) - have
	p.log.Info("producer starting", "already_committed", have, "to_commit", max(remaining, 0), "tag", p.tag)
	var wg sync.WaitGroup
	for range p.cfg.ProducerWorkers {
		wg.Go(func() {
			backoff := 100 * time.Millisecond
			for ctx.Err() == nil && p.committed.Load() < remaining {
				p.pace.wait(ctx)
				if err := p.once(ctx); err != nil {
					if ctx.Err() != nil {
						return
					}
					// The database is down (a restart, say). A transaction
					// whose COMMIT failed may still have committed; the
					// produced table is the truth the checker reads.
					p.failed.Add(1)
					p.log.Warn("producer: transaction failed; retrying", "error", err, "retry_in", backoff)
					sleep(ctx, backoff)
					backoff = min(2*backoff, 2*time.Second)
					continue
				}
				backoff = 100 * time.Millisecond
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	p.log.Info(msgProducerDone, "committed", p.committed.Load(), "rolled_back", p.rolledBack.Load(),
		"republished", p.republished.Load(), "failed", p.failed.Load())
	return nil
}

// once runs one producer transaction of a randomly chosen kind.
func (p *producer) once(ctx context.Context) error {
	r := mrand.Float64()
	if classes := p.poisonClasses(); len(classes) > 0 {
		if total := p.cfg.PoisonRatio * float64(len(classes)); r < total {
			return p.poison(ctx, classes[int(r/p.cfg.PoisonRatio)%len(classes)])
		}
		r = mrand.Float64()
	}
	switch {
	case r < p.cfg.RollbackRatio:
		return p.rollback(ctx)
	case r < p.cfg.RollbackRatio+p.cfg.RepublishRatio:
		if o, ok := p.pick(); ok {
			return p.republish(ctx, o)
		}
	}
	return p.commit(ctx)
}

func (p *producer) next() workload.Order {
	seq := p.seq.Add(1)
	o := workload.Order{ID: fmt.Sprintf("%s/%s/%d", p.cfg.Names.Run, p.tag, seq), Seq: seq, Producer: p.cfg.Instance}
	if p.cfg.PayloadBytes > 0 {
		o.Pad = strings.Repeat("x", p.cfg.PayloadBytes)
	}
	return o
}

func (p *producer) headers(o workload.Order) bus.Headers {
	return bus.Headers{bus.HeaderMessageID: o.ID, bus.HeaderMessageType: p.cfg.Names.OrderType()}
}

// publishIn writes the produced row and the outbox row in tx.
func (p *producer) publishIn(ctx context.Context, tx *gorm.DB, o workload.Order) error {
	if err := tx.Exec(`INSERT INTO `+p.cfg.Names.Table(workload.TableProduced)+` (message_id, producer, phase) VALUES (?, ?, ?)`, o.ID, p.cfg.Instance, p.cfg.Phase).Error; err != nil {
		return err
	}
	return p.b.PublishTx(ctx, tx, o, p.headers(o))
}

// inTx runs fn in a transaction: every other order in b.Transaction (on
// PostgreSQL the outbox row goes in with the COMMIT), the others in a GORM
// transaction of the service's own (the row is written by PublishTx), so
// that the faults hit both write paths.
func (p *producer) inTx(ctx context.Context, o workload.Order, fn func(tx *gorm.DB) error) error {
	if o.Seq%2 == 0 {
		return p.b.Transaction(ctx, fn)
	}
	return p.db.WithContext(ctx).Transaction(fn)
}

func (p *producer) commit(ctx context.Context) error {
	o := p.next()
	if err := p.inTx(ctx, o, func(tx *gorm.DB) error { return p.publishIn(ctx, tx, o) }); err != nil {
		return err
	}
	p.committed.Add(1)
	p.mu.Lock()
	p.sent = append(p.sent, o)
	p.mu.Unlock()
	return nil
}

func (p *producer) rollback(ctx context.Context) error {
	o := p.next()
	err := p.inTx(ctx, o, func(tx *gorm.DB) error {
		if err := p.publishIn(ctx, tx, o); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		return err // failed before the deliberate rollback: nothing to record
	}
	// Recorded after the rollback, outside the transaction: the checker
	// verifies that no effect and no outbox row exists for these ids.
	if err := p.db.WithContext(ctx).Exec(`INSERT INTO `+p.cfg.Names.Table(workload.TableRolledBack)+` (message_id) VALUES (?)`, o.ID).Error; err != nil {
		return err
	}
	p.rolledBack.Add(1)
	return nil
}

func (p *producer) republish(ctx context.Context, o workload.Order) error {
	err := p.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`INSERT INTO `+p.cfg.Names.Table(workload.TableRepublished)+` (message_id) VALUES (?)`, o.ID).Error; err != nil {
			return err
		}
		return p.b.PublishTx(ctx, tx, o, p.headers(o))
	})
	if err == nil {
		p.republished.Add(1)
	}
	return err
}

// pick returns a random order this incarnation committed: sometimes one
// just sent (a re-publish close behind the original), sometimes an old one.
func (p *producer) pick() (workload.Order, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sent) == 0 {
		return workload.Order{}, false
	}
	if mrand.IntN(2) == 0 {
		return p.sent[len(p.sent)-1], true
	}
	return p.sent[mrand.IntN(len(p.sent))], true
}

// pacer spaces transactions to a rate shared by all workers.
type pacer struct {
	mu       sync.Mutex
	interval time.Duration
	next     time.Time
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{interval: time.Duration(float64(time.Second) / rate)}
}

func (p *pacer) wait(ctx context.Context) {
	if p.interval == 0 {
		return
	}
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	at := p.next
	p.next = p.next.Add(p.interval)
	p.mu.Unlock()
	sleep(ctx, time.Until(at))
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
