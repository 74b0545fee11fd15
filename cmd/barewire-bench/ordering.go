package main

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/barewire-go/barewire/bus"
)

// orderingScenario measures the e2e pipeline with per-key ordering off and
// on, one after the other in the same run: the same producers, consumers
// and database; "on" makes the endpoint Ordered(-ordering-partitions) and
// gives every message one of -ordering-keys keys (so the outbox claims per
// key, FIFO, and each partition queue has one consumer).
func (r *runner) orderingScenario(ctx context.Context) error {
	ph := r.defaultPhase()
	tr := newTracker()
	off, err := r.measure(ctx, "ordering", "off", newBareWire(r.cfg, r.env, tr, "ordoff"), tr, ph)
	if err != nil {
		return err
	}
	off.setRatio(off.MsgsPerS, "itself")
	r.add(off)
	tr = newTracker()
	p := newBareWire(r.cfg, r.env, tr, "ordon")
	p.partitions, p.keys = r.cfg.orderingPartitions, r.cfg.orderingKeys
	on, err := r.measure(ctx, "ordering", "on", p, tr, ph)
	if err != nil {
		return err
	}
	on.setRatio(off.MsgsPerS, "ordering/off")
	on.Notes = append(on.Notes, fmt.Sprintf("%d partitions, %d keys", p.partitions, p.keys))
	r.add(on)
	return nil
}

// orderingKey picks message id's key among p.keys.
func (p *barewirePipe) orderingKey(id string, h bus.Headers) bus.Headers {
	if p.partitions == 0 {
		return h
	}
	f := fnv.New32a()
	_, _ = f.Write([]byte(id))
	return bus.OrderingKey(fmt.Sprintf("key-%d", f.Sum32()%uint32(p.keys)), h)
}
