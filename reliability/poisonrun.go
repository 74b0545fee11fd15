//go:build linux

package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/reliability/workload"
)

// runPhases runs a phased profile's producers one after the other (see
// Profile.Phases), then drains.
func (r *run) runPhases(ctx context.Context) error {
	p := r.prof
	loadStart := time.Now()
	total := 0
	for _, ph := range p.Phases {
		total += ph.Messages
		name := "producer-" + ph.Name
		args := append(r.baseArgs(name, "producer"),
			"-messages", strconv.Itoa(total), "-producer-workers", strconv.Itoa(p.ProducerWorkers),
			"-rate", fmt.Sprint(p.Rate), "-rollback-ratio", fmt.Sprint(p.RollbackRatio),
			"-republish-ratio", fmt.Sprint(p.RepublishRatio),
			"-phase", ph.Name, "-poison-ratio", fmt.Sprint(ph.PoisonRatio))
		start := time.Now()
		prod, err := r.start(name, args)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.phaseProducers = append(r.phaseProducers, prod)
		r.mu.Unlock()
		r.env.Logf("phase %s: producing up to %d committed orders (poison ratio %v per class)", ph.Name, total, ph.PoisonRatio)
		timeout := time.NewTimer(p.LoadTimeout)
		select {
		case <-prod.Done():
		case <-timeout.C:
			r.res.Notes = append(r.res.Notes, fmt.Sprintf("phase %s: the producer was stopped at the load timeout (%v)", ph.Name, p.LoadTimeout))
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if err := prod.Stop(stopCtx); err != nil {
				r.res.Problems = append(r.res.Problems, err.Error())
			}
			cancel()
		case <-ctx.Done():
			timeout.Stop()
			return ctx.Err()
		}
		timeout.Stop()
		if err := prod.Err(); err != nil {
			r.res.Problems = append(r.res.Problems, err.Error())
		}
		produced := time.Since(start)
		// The next phase starts once this one's good traffic is processed,
		// so that each phase's latency is its own (30 s: good traffic
		// stalled longer fails the run anyway).
		settled := r.waitGoodProcessed(ctx, 30*time.Second)
		r.res.PhaseLog = append(r.res.PhaseLog, fmt.Sprintf("%s: produced in %v, processed %v later (settled: %v)",
			ph.Name, produced.Round(time.Millisecond), (time.Since(start)-produced).Round(time.Millisecond), settled))
	}
	r.res.Load = time.Since(loadStart)
	r.env.Logf("phases done in %s; draining", r.res.Load.Round(time.Millisecond))
	drainStart := time.Now()
	r.drain(ctx)
	r.res.Drain = time.Since(drainStart)
	return nil
}

// waitGoodProcessed polls until every committed order has its effects and
// follow-ups, or d passed.
func (r *run) waitGoodProcessed(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		pr, err := ReadProgress(ctx, r.db, r.names)
		if err == nil && pr.EffectRows >= 2*pr.Committed && pr.FollowupRows >= 2*pr.Committed {
			return true
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return false
		}
	}
	return false
}

// checkPoison reads the poison observations of the run and judges them.
// It runs after every process stopped.
func (r *run) checkPoison(ctx context.Context) (*PoisonReport, error) {
	n := r.names
	db := r.db.WithContext(ctx)
	o := PoisonObservations{
		Classes: workload.PoisonClasses(r.prof.Transport), Parked: map[string]Parked{}, Effects: map[string]int{},
		Reconnects: r.res.counter("reconnects"), Bounds: r.prof.Poison, End: time.Now(),
	}
	for _, ph := range r.prof.Phases {
		if ph.PoisonRatio > 0 {
			o.PoisonPhase = ph.Name
		}
	}
	var sent []struct {
		PoisonKey, Class, Outcome, Error string
		MessageID                        *string
		CreatedAt                        time.Time
	}
	poisonT := n.Table(workload.TablePoison)
	if err := db.Raw(`SELECT poison_key, class, outcome, error, message_id, created_at FROM ` + poisonT).Scan(&sent).Error; err != nil {
		return nil, fmt.Errorf("reliability: poison rows: %w", err)
	}
	for _, s := range sent {
		ps := PoisonSent{Key: s.PoisonKey, Class: s.Class, Outcome: s.Outcome, Error: s.Error, SentAt: s.CreatedAt}
		if s.MessageID != nil {
			ps.MessageID = *s.MessageID
		}
		o.Sent = append(o.Sent, ps)
	}
	var parked []struct {
		PoisonKey, LastError string
		AvailableAt          time.Time
	}
	// available_at is when the relay last put the row back (its last failed
	// attempt): the closest the outbox comes to a parked time.
	if err := db.Raw(`SELECT p.poison_key, o.last_error, o.available_at FROM ` + n.Table("outbox") + ` o JOIN ` + poisonT +
		` p ON p.message_id = o.message_id WHERE o.status = 'parked'`).Scan(&parked).Error; err != nil {
		return nil, fmt.Errorf("reliability: parked poison: %w", err)
	}
	for _, pk := range parked {
		o.Parked[pk.PoisonKey] = Parked{Reason: pk.LastError, At: pk.AvailableAt}
	}
	var effects []struct {
		PoisonKey string
		N         int
	}
	if err := db.Raw(`SELECT p.poison_key, count(*) AS n FROM ` + n.Table(workload.TableEffects) + ` e JOIN ` + poisonT +
		` p ON p.message_id = e.message_id GROUP BY p.poison_key`).Scan(&effects).Error; err != nil {
		return nil, fmt.Errorf("reliability: poison effects: %w", err)
	}
	for _, e := range effects {
		o.Effects[e.PoisonKey] = e.N
	}
	for _, ph := range r.prof.Phases {
		var l struct {
			N        int64
			P50, P99 float64
		}
		if err := db.Raw(`SELECT count(*) AS n,
    coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.created_at - p.created_at)), 0) AS p50,
    coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM e.created_at - p.created_at)), 0) AS p99
FROM `+n.Table(workload.TableEffects)+` e JOIN `+n.Table(workload.TableProduced)+` p ON p.message_id = e.message_id WHERE p.phase = ?`, ph.Name).Scan(&l).Error; err != nil {
			return nil, fmt.Errorf("reliability: latency of phase %s: %w", ph.Name, err)
		}
		var slow []struct {
			MessageID, Endpoint, Instance string
			Attempt                       int
			Produced                      time.Time
			Secs                          float64
		}
		if err := db.Raw(`SELECT p.message_id, e.endpoint, e.instance, e.attempt, p.created_at AS produced,
    extract(epoch FROM e.created_at - p.created_at) AS secs
FROM `+n.Table(workload.TableEffects)+` e JOIN `+n.Table(workload.TableProduced)+` p ON p.message_id = e.message_id
WHERE p.phase = ? ORDER BY secs DESC LIMIT 8`, ph.Name).Scan(&slow).Error; err != nil {
			return nil, fmt.Errorf("reliability: slowest effects of phase %s: %w", ph.Name, err)
		}
		pl := PhaseLatency{Phase: ph.Name, Samples: l.N, P50: time.Duration(l.P50 * float64(time.Second)), P99: time.Duration(l.P99 * float64(time.Second))}
		for _, e := range slow {
			pl.Slowest = append(pl.Slowest, SlowEffect{MessageID: e.MessageID, Endpoint: e.Endpoint, Instance: e.Instance,
				Attempt: e.Attempt, Produced: e.Produced, Latency: time.Duration(e.Secs * float64(time.Second))})
		}
		o.Latency = append(o.Latency, pl)
	}
	var errQueues []string
	for _, q := range n.Queues() {
		errQueues = append(errQueues, q+"_error")
	}
	var err error
	if dl, ok := r.queues.(deadLetterReader); ok {
		o.DeadLetters, err = dl.DeadLetters(ctx, errQueues)
	} else if r.prof.Transport == TransportPostgres {
		o.DeadLetters, err = r.pgDeadLetters(ctx, errQueues)
	} else {
		o.DeadLetters, err = amqpDeadLetters(r.env.AMQPURL, errQueues)
	}
	if err != nil {
		return nil, err
	}
	return EvaluatePoison(o), nil
}

// deadLetterFrom reads a dead letter's headers.
func deadLetterFrom(queue, id string, h map[string]string) DeadLetter {
	d := DeadLetter{Queue: queue, MessageID: id, Key: h[workload.HeaderPoisonKey], Reason: h[bus.HeaderFaultReason], Endpoint: h[bus.HeaderFaultEndpoint]}
	d.Attempts, _ = strconv.Atoi(h[bus.HeaderFaultAttempts])
	d.At, _ = time.Parse(time.RFC3339Nano, h[bus.HeaderFaultTime])
	return d
}

// amqpDeadLetters reads every message of the error queues without
// removing any: the channel closes with them unacknowledged, so they go
// back to their queues (kept for inspection when the run fails).
func amqpDeadLetters(url string, queues []string) ([]DeadLetter, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var out []DeadLetter
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return nil, err
		}
		for {
			d, ok, err := ch.Get(q, false)
			if err != nil {
				var ae *amqp.Error
				if errors.As(err, &ae) && ae.Code == amqp.NotFound {
					break // no dead letter was ever sent there
				}
				return nil, fmt.Errorf("reliability: reading %s: %w", q, err)
			}
			if !ok {
				break
			}
			h := map[string]string{}
			for k, v := range d.Headers {
				switch v := v.(type) {
				case string:
					h[k] = v
				case []byte:
					h[k] = string(v)
				default:
					h[k] = fmt.Sprint(v)
				}
			}
			id := d.MessageId
			if id == "" {
				id = h[bus.HeaderMessageID]
			}
			out = append(out, deadLetterFrom(q, id, h))
		}
		_ = ch.Close()
	}
	return out, nil
}

// pgDeadLetters reads the PostgreSQL transport's error queue rows.
func (r *run) pgDeadLetters(ctx context.Context, queues []string) ([]DeadLetter, error) {
	var rows []struct {
		Queue, MessageID, Metadata string
	}
	if err := r.db.WithContext(ctx).Raw(`SELECT queue, message_id, metadata::text AS metadata FROM `+r.names.TransportTables()[0]+` WHERE queue IN ?`, queues).
		Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("reliability: dead letters: %w", err)
	}
	var out []DeadLetter
	for _, row := range rows {
		h := map[string]string{}
		var raw map[string]any
		if err := json.Unmarshal([]byte(row.Metadata), &raw); err != nil {
			return nil, fmt.Errorf("reliability: dead letter metadata of %s: %w", row.Queue, err)
		}
		for k, v := range raw {
			if s, ok := v.(string); ok {
				h[k] = s
			} else {
				h[k] = fmt.Sprint(v)
			}
		}
		out = append(out, deadLetterFrom(row.Queue, row.MessageID, h))
	}
	return out, nil
}
