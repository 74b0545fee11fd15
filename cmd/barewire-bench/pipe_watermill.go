package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmamqp"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmnats"
	"github.com/barewire-go/barewire/transport/wmpubsub/wmredis"
)

// watermillPresets are the presets the watermill scenario measures: the
// e2e pipeline (PublishTx → outbox → relay → endpoint with the inbox) with
// the Watermill preset as its transport. NATS and Redis are read from
// BAREWIRE_TEST_NATS_URL and BAREWIRE_TEST_REDIS_ADDR; a preset whose
// server is not given is skipped.
var watermillPresets = []string{"wmamqp", "wmnats", "wmredis"}

func natsURL() string   { return os.Getenv("BAREWIRE_TEST_NATS_URL") }
func redisAddr() string { return os.Getenv("BAREWIRE_TEST_REDIS_ADDR") }

// newWatermill is the e2e pipeline on a Watermill preset.
func newWatermill(cfg *config, e *env, tr *tracker, preset string) *barewirePipe {
	p := newBareWire(cfg, e, tr, preset)
	p.wm = preset
	return p
}

// wmFactory builds the preset's transport with the pipeline's endpoint.
func (p *barewirePipe) wmFactory(declare func(*endpoint.Endpoints)) transport.Factory {
	switch p.wm {
	case "wmnats":
		return wmnats.New(natsURL(), func(c *wmnats.Config) { declare(&c.Endpoints) })
	case "wmredis":
		return wmredis.New(redisAddr(), func(c *wmredis.Config) { declare(&c.Endpoints) })
	}
	return wmamqp.New(p.env.url, func(c *wmamqp.Config) {
		c.PrefetchCount = p.cfg.prefetch
		declare(&c.Endpoints)
	})
}

// wmCleanup deletes the streams a NATS or Redis run wrote (RabbitMQ's
// queues and exchange are the env's to delete).
func (p *barewirePipe) wmCleanup(ctx context.Context) error {
	queues := []string{p.queue, p.queue + "_error"}
	switch p.wm {
	case "wmnats":
		conn, err := nats.Connect(natsURL())
		if err != nil {
			return err
		}
		defer conn.Close()
		js, err := conn.JetStream()
		if err != nil {
			return err
		}
		var errs []error
		for _, s := range []string{wmnats.Name("q:" + queues[0]), wmnats.Name("q:" + queues[1]), wmnats.Name(p.typ)} {
			if err := js.DeleteStream(s, nats.Context(ctx)); err != nil && !errors.Is(err, nats.ErrStreamNotFound) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	case "wmredis":
		c := redis.NewClient(&redis.Options{Addr: redisAddr()})
		defer c.Close()
		return c.Del(ctx, wmredis.QueuePrefix+queues[0], wmredis.QueuePrefix+queues[1], p.typ).Err()
	}
	return nil
}

// watermill measures each preset's closed-loop peak (the e2e pipeline's
// phase) right after this run's baseline, with its ratio to it and, when
// e2e ran, to the RabbitMQ e2e.
func (r *runner) watermill(ctx context.Context) error {
	if err := r.ensureBaseline(ctx); err != nil {
		return err
	}
	for _, preset := range watermillPresets {
		if preset == "wmnats" && natsURL() == "" || preset == "wmredis" && redisAddr() == "" {
			logf("   %s: skipped (set BAREWIRE_TEST_NATS_URL / BAREWIRE_TEST_REDIS_ADDR)", preset)
			continue
		}
		ph := r.defaultPhase()
		tr := newTracker()
		p := newWatermill(r.cfg, r.env, tr, preset)
		res, err := r.measure(ctx, preset, variantFor(ph.rate), p, tr, ph)
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if cerr := p.wmCleanup(cctx); cerr != nil {
			logf("   %s cleanup: %v", preset, cerr)
		}
		cancel()
		if err != nil {
			return err
		}
		if ph.rate > 0 {
			res.setRatio(ph.rate, "offered rate")
		} else {
			res.setRatio(r.basePeak, "baseline peak")
		}
		if r.e2ePeak > 0 && res.OfferedRate == 0 {
			if res.Extra == nil {
				res.Extra = map[string]any{}
			}
			res.Extra["ratio_to_e2e"] = res.MsgsPerS / r.e2ePeak
			res.Notes = append(res.Notes, fmt.Sprintf("%.2f of this run's RabbitMQ e2e", res.MsgsPerS/r.e2ePeak))
		}
		r.add(res)
	}
	return nil
}
