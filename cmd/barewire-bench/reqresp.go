package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

type rrQuestion struct {
	N int `json:"n"`
}

type rrAnswer struct {
	N int `json:"n"`
}

// rrConcurrency is the requesters of the concurrent phase.
const rrConcurrency = 8

// requestResponse measures a request/response round trip on RabbitMQ, idle
// (one request at a time after a short pause) and with 8 concurrent
// requesters in a closed loop against one endpoint: BareWire (bus.Request;
// the consumer answers with Respond through the outbox on PostgreSQL, with
// the inbox) beside the same exchange written by hand with amqp091 (an
// exclusive reply queue, correlation ids, no database) in the same run.
func (r *runner) requestResponse(ctx context.Context) error {
	call, closeBW, err := r.rrBareWire(ctx)
	if err != nil {
		return fmt.Errorf("barewire: %w", err)
	}
	bw := r.rrPhases(ctx, "barewire", call)
	closeBW()
	call, closeHand, err := r.rrHand(ctx)
	if err != nil {
		return fmt.Errorf("amqp091: %w", err)
	}
	hand := r.rrPhases(ctx, "amqp091 by hand", call)
	closeHand()
	for i := range bw {
		if hand[i].MsgsPerS > 0 {
			bw[i].setRatio(hand[i].MsgsPerS, "amqp091 by hand, same phase")
		}
		r.add(hand[i])
		r.add(bw[i])
	}
	return nil
}

// rrPhases runs the idle and the concurrent phase with call.
func (r *runner) rrPhases(ctx context.Context, variant string, call func(ctx context.Context, n int) error) []Result {
	var out []Result
	for _, conc := range []int{1, rrConcurrency} {
		name := "rr-idle"
		if conc > 1 {
			name = fmt.Sprintf("rr-%d-requesters", conc)
		}
		for end := time.Now().Add(r.cfg.warmup); time.Now().Before(end) && ctx.Err() == nil; {
			_ = call(ctx, 0)
		}
		var mu sync.Mutex
		var lat []float64
		var failed atomic.Int64
		var n atomic.Int64
		start := time.Now()
		end := start.Add(r.cfg.duration)
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					if conc == 1 {
						time.Sleep(20 * time.Millisecond) // idle: nothing else in flight
					}
					t0 := time.Now()
					if err := call(ctx, int(n.Add(1))); err != nil {
						failed.Add(1)
						continue
					}
					d := float64(time.Since(t0).Microseconds()) / 1000
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		ps := percentiles(lat, 50, 95, 99, 100)
		res := Result{Scenario: name, Variant: variant, MsgsPerS: float64(len(lat)) / elapsed,
			P50: ps[0], P95: ps[1], P99: ps[2], Max: ps[3], Samples: len(lat), Consumed: int64(len(lat)),
			DurationS: elapsed, Producers: conc, Consumers: rrConcurrency, Payload: 0}
		res.RSSStartMB, res.RSSMidMB, res.RSSEndMB, res.PeakRSSMB = r.rss.window(start, start.Add(time.Duration(elapsed*float64(time.Second))))
		res.Notes = append(res.Notes, "round trips per second; latency = request sent → response decoded")
		if f := failed.Load(); f > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%d requests failed", f))
		}
		out = append(out, res)
	}
	return out
}

// rrBareWire starts a bus on RabbitMQ and PostgreSQL with one endpoint that
// answers with Respond, and returns a call that requests through it.
func (r *runner) rrBareWire(ctx context.Context) (func(context.Context, int) error, func(), error) {
	tag := r.env.name("rr")
	queue, typ, prefix := tag+".q", "RRQuestion."+tag, tag+"_"
	r.env.addQueues(queue, queue+"_error")
	r.env.addExchanges(typ)
	r.env.addTables(prefix+"inbox", prefix+"outbox")
	db, err := openHookedPostgres(r.env.dsn, rrConcurrency+8)
	if err != nil {
		return nil, nil, err
	}
	b, err := bus.New(
		bus.WithLogger(benchLogger()),
		bus.WithInstanceID("barewire-bench-"+tag),
		bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }),
		bus.WithTransport(rabbitmq.New(r.env.url, func(c *rabbitmq.Config) {
			c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) {
				e.ConcurrentMessageLimit = rrConcurrency
				endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[rrQuestion]) error {
					return c.Respond(ctx, rrAnswer(c.Message))
				}, endpoint.AsMessageType(typ))
			})
		})),
	)
	if err != nil {
		return nil, nil, err
	}
	if err := b.Start(ctx); err != nil {
		return nil, nil, err
	}
	h := bus.WithRequestHeaders(bus.Headers{bus.HeaderMessageType: typ})
	call := func(ctx context.Context, n int) error {
		a, err := bus.Request[rrAnswer](ctx, b, queue, rrQuestion{N: n}, h, bus.WithRequestTimeout(10*time.Second))
		if err == nil && a.N != n {
			err = fmt.Errorf("answer %d to question %d", a.N, n)
		}
		return err
	}
	return call, func() {
		_ = b.Stop(context.WithoutCancel(ctx))
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	}, nil
}

// rrHand is the same exchange with amqp091 alone: a durable request queue
// consumed by rrConcurrency goroutines (manual acks, prefetch 1 each)
// answering on their own channel to the reply_to queue with the request's
// correlation id; the requester consumes an exclusive server-named reply
// queue with auto-ack and matches answers by correlation id. No publisher
// confirms and no database: the broker's round trip floor.
func (r *runner) rrHand(ctx context.Context) (func(context.Context, int) error, func(), error) {
	conn, err := amqp.Dial(r.env.url)
	if err != nil {
		return nil, nil, err
	}
	queue := r.env.name("rrhand") + ".q"
	r.env.addQueues(queue)
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	for range rrConcurrency {
		rch, err := conn.Channel()
		if err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
		_ = rch.Qos(1, 0, false)
		ds, err := rch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
		go func() {
			for d := range ds {
				_ = rch.PublishWithContext(context.Background(), "", d.ReplyTo, false, false, amqp.Publishing{
					CorrelationId: d.CorrelationId, ContentType: "application/json", Body: d.Body,
				})
				_ = d.Ack(false)
			}
		}()
	}
	reply, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	answers, err := ch.Consume(reply.Name, "", true, true, false, false, nil)
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	var mu sync.Mutex
	waiting := map[string]chan []byte{}
	go func() {
		for d := range answers {
			mu.Lock()
			w := waiting[d.CorrelationId]
			delete(waiting, d.CorrelationId)
			mu.Unlock()
			if w != nil {
				w <- d.Body
			}
		}
	}()
	pch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	var pmu sync.Mutex
	var seq atomic.Int64
	call := func(ctx context.Context, n int) error {
		id := fmt.Sprintf("%d", seq.Add(1))
		w := make(chan []byte, 1)
		mu.Lock()
		waiting[id] = w
		mu.Unlock()
		body := fmt.Appendf(nil, `{"n":%d}`, n)
		pmu.Lock()
		err := pch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{
			CorrelationId: id, ReplyTo: reply.Name, ContentType: "application/json", Body: body,
		})
		pmu.Unlock()
		if err != nil {
			return err
		}
		select {
		case got := <-w:
			if string(got) != string(body) {
				return fmt.Errorf("answer %s to %s", got, body)
			}
			return nil
		case <-time.After(10 * time.Second):
			mu.Lock()
			delete(waiting, id)
			mu.Unlock()
			return errors.New("no answer within 10s")
		}
	}
	return call, func() { _ = conn.Close() }, nil
}
