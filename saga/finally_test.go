package saga_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/inproc"
)

type Job struct {
	saga.State
	Steps string
}

type JobStarted struct{ ID string }
type JobDone struct{ ID string }
type JobHijacked struct{ ID, To string }
type JobNotice struct{ ID, What string }

// jobWorld runs a machine whose Finally fails for instances named
// "refuse-*" and whose JobHijacked step sets CurrentState itself.
func jobWorld(t *testing.T, keep bool) (*bus.Bus, *saga.Machine[Job], chan string, chan string) {
	t.Helper()
	var opts []saga.Option
	if keep {
		opts = append(opts, saga.KeepFinalized())
	}
	opts = append(opts, saga.WithTable("saga_job_"+strings.ReplaceAll(uuid.NewString()[:8], "-", "")))
	m, err := saga.New("jobs", func(m *saga.Machine[Job]) {
		running := m.State("Running")
		started := saga.NewEvent(m, func(e JobStarted) string { return e.ID })
		done := saga.NewEvent(m, func(e JobDone) string { return e.ID })
		hijacked := saga.NewEvent(m, func(e JobHijacked) string { return e.ID })
		m.Initially(
			saga.When(started).TransitionTo(running),
			// Started and finalized by one event.
			saga.When(done).Then(func(ctx context.Context, c *saga.Context[Job, JobDone]) error {
				c.Instance.Steps += "done-at-once,"
				return nil
			}).Finalize(),
		)
		m.During(running,
			saga.When(done).
				Publish(func(c *saga.Context[Job, JobDone]) any { return JobNotice{ID: c.Message.ID, What: "done"} }).
				Then(func(ctx context.Context, c *saga.Context[Job, JobDone]) error {
					c.Instance.Steps += "done,"
					return nil
				}).
				Finalize(),
			saga.When(hijacked).Then(func(ctx context.Context, c *saga.Context[Job, JobHijacked]) error {
				c.State().CurrentState = c.Message.To
				return nil
			}),
		)
		m.Finally(func(ctx context.Context, c *saga.Context[Job, any]) error {
			if strings.HasPrefix(c.State().CorrelationID, "refuse-") {
				return endpoint.Permanent(errors.New("archive refused the job"))
			}
			c.Instance.Steps += "finally,"
			return c.Publish(ctx, JobNotice{ID: c.State().CorrelationID, What: "finally"}, nil)
		})
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	notices, faults := make(chan string, 16), make(chan string, 16)
	b, err := bus.New(quiet(), bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("jobs", func(e *endpoint.Endpoint) {
			saga.Register(e, m)
			e.ConcurrentMessageLimit, e.PrefetchCount = 1, 1 // in order
		})
		c.ReceiveEndpoint("job-notices", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[JobNotice]) error {
				notices <- c.Message.ID + ":" + c.Message.What
				return nil
			})
		})
		c.ReceiveEndpoint("jobs_error", func(e *endpoint.Endpoint) {
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				faults <- d.Headers["BW-Fault-Reason"]
				return nil
			})
		})
	})))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	if err := saga.Migrate(ctx, b.DB(), m); err != nil {
		t.Fatal(err)
	}
	return b, m, notices, faults
}

// TestFinally: Finally runs once when an instance is finalized, in the
// transition's transaction: what it publishes leaves with it, what it
// changes is kept (KeepFinalized), and when it fails nothing of the
// transition happens — no state change, no message from the behavior's
// steps or from Finally. An instance started and finalized by one event
// runs Finally too.
func TestFinally(t *testing.T) {
	for _, keep := range []bool{false, true} {
		name := "deleted"
		if keep {
			name = "kept"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b, m, notices, faults := jobWorld(t, keep)
			pub := func(msg any) {
				if err := b.Publish(ctx, msg, nil); err != nil {
					t.Fatal(err)
				}
			}
			pub(JobStarted{ID: "refuse-1"})
			pub(JobDone{ID: "refuse-1"})
			if r := <-faults; !strings.Contains(r, "archive refused the job") {
				t.Errorf("fault reason %q", r)
			}
			j, err := m.Get(ctx, b.DB(), "refuse-1")
			if err != nil || j.CurrentState != "Running" || j.Version != 1 || j.Steps != "" {
				t.Errorf("after a failed Finally: %+v, %v; want Running, version 1, no steps", j, err)
			}
			pub(JobStarted{ID: "ok-1"})
			pub(JobDone{ID: "ok-1"})
			pub(JobDone{ID: "ok-2"}) // started and finalized at once
			var got []string
			for range 3 {
				got = append(got, <-notices)
			}
			sort.Strings(got)
			if strings.Join(got, " ") != "ok-1:done ok-1:finally ok-2:finally" {
				t.Errorf("notices %v: the failed transition's publish left, or Finally did not run once each", got)
			}
			for _, id := range []string{"ok-1", "ok-2"} {
				j, err := m.Get(ctx, b.DB(), id)
				switch {
				case !keep && !errors.Is(err, saga.ErrNotFound):
					t.Errorf("%s: finalized instance not deleted: %v", id, err)
				case keep && (err != nil || j.CurrentState != string(saga.Final) || !strings.HasSuffix(j.Steps, "finally,")):
					t.Errorf("%s kept: %+v, %v; want Final with Finally's change", id, j, err)
				}
			}
			select {
			case r := <-faults:
				t.Errorf("unexpected fault %q", r)
			case n := <-notices:
				t.Errorf("unexpected notice %q", n)
			default:
			}
		})
	}
}

// TestStepCannotStrandInstance: a step that sets CurrentState itself to an
// undeclared state (or back to Initial) fails the event permanently and
// changes nothing; declared states are accepted.
func TestStepCannotStrandInstance(t *testing.T) {
	ctx := context.Background()
	b, m, _, faults := jobWorld(t, false)
	for _, msg := range []any{JobStarted{ID: "h"}, JobHijacked{ID: "h", To: "Nowhere"}, JobHijacked{ID: "h", To: "Initial"}} {
		if err := b.Publish(ctx, msg, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, to := range []string{"Nowhere", "Initial"} {
		if r := <-faults; !strings.Contains(r, `moved instance "h" from "Running" to "`+to+`", which is undeclared or Initial`) {
			t.Errorf("fault reason %q", r)
		}
	}
	if j, err := m.Get(ctx, b.DB(), "h"); err != nil || j.CurrentState != "Running" || j.Version != 1 {
		t.Errorf("instance after refused moves: %+v, %v", j, err)
	}
	if err := b.Publish(ctx, JobHijacked{ID: "h", To: "Running"}, nil); err != nil {
		t.Fatal(err)
	}
	settled(t, 6, b) // the start, 2 dead-lettered, their 2 error-queue deliveries, this one
	if j, err := m.Get(ctx, b.DB(), "h"); err != nil || j.CurrentState != "Running" || j.Version != 2 {
		t.Errorf("a step setting a declared state: %+v, %v", j, err)
	}
}
