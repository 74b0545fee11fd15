package bustest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/bustest"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/transport/inproc"
)

type PriceQuery struct{ SKU string }

type PriceAnswer struct {
	SKU   string
	Cents int
}

// TestRespondedSeesOnlyCommittedResponses: the first attempt answers and
// fails (its response rolls back), the retry answers and commits; Responded
// returns the committed one, and the requester gets it.
func TestRespondedSeesOnlyCommittedResponses(t *testing.T) {
	t.Parallel()
	var attempts atomic.Int32
	h := bustest.New(t, bus.WithTransport(inproc.New(func(c *inproc.Config) {
		c.ReceiveEndpoint("prices", func(e *endpoint.Endpoint) {
			e.Retry = endpoint.Immediate(1)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[PriceQuery]) error {
				if attempts.Add(1) == 1 {
					if err := c.Respond(ctx, PriceAnswer{SKU: c.Message.SKU, Cents: -1}); err != nil {
						return err
					}
					return errors.New("failed after answering")
				}
				return c.Respond(ctx, PriceAnswer{SKU: c.Message.SKU, Cents: 120})
			})
		})
	})))
	type result struct {
		a   PriceAnswer
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := bus.Request[PriceAnswer](context.Background(), h.Bus, "prices", PriceQuery{SKU: "pear"})
		done <- result{a, err}
	}()
	req := bustest.Consumed[PriceQuery](h, bustest.OnEndpoint("prices"))
	resp := bustest.Responded[PriceAnswer](h, bustest.AnswerTo(req.MessageID), bustest.Relayed())
	if resp.Message.Cents != 120 || resp.ParentAttempt != 2 || resp.Destination != req.Headers[bus.HeaderResponseAddress] {
		t.Fatalf("response %+v from attempt %d to %s", resp.Message, resp.ParentAttempt, resp.Destination)
	}
	if r := <-done; r.err != nil || r.a.Cents != 120 {
		t.Fatalf("requester got %+v, %v", r.a, r.err)
	}
}
