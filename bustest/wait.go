package bustest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/barewire-go/barewire/bus"
)

// Filter narrows what a wait accepts.
type Filter struct {
	desc    string
	match   func(*Record) bool
	outcome bool // sets the outcome (Consumed's default is committed)
}

// OnEndpoint accepts records of endpoint name.
func OnEndpoint(name string) Filter {
	return Filter{desc: "on endpoint " + name, match: func(r *Record) bool { return r.Endpoint == name }}
}

// WithID accepts the message with id.
func WithID(id string) Filter {
	return Filter{desc: "with id " + id, match: func(r *Record) bool { return r.MessageID == id }}
}

// WithOutcome accepts deliveries handled with one of outcomes
// (bus.OutcomeCommitted, bus.OutcomeDuplicate, ...).
func WithOutcome(outcomes ...string) Filter {
	return Filter{desc: "with outcome " + strings.Join(outcomes, " or "), outcome: true, match: func(r *Record) bool {
		for _, o := range outcomes {
			if r.Outcome == o {
				return true
			}
		}
		return false
	}}
}

// AnyOutcome accepts deliveries handled with any outcome.
func AnyOutcome() Filter {
	return Filter{desc: "with any outcome", outcome: true, match: func(*Record) bool { return true }}
}

// Relayed makes Published wait until the relay delivered the outbox row
// (a direct publish counts as delivered).
func Relayed() Filter {
	return Filter{desc: "delivered by the relay", match: func(r *Record) bool { return !r.Outbox || r.Relayed }}
}

// ToDestination accepts publications to dest ("queue:billing",
// "exchange:OrderPlaced", or a bare endpoint name for "queue:<name>").
func ToDestination(dest string) Filter {
	if !strings.Contains(dest, ":") {
		dest = "queue:" + dest
	}
	return Filter{desc: "to " + dest, match: func(r *Record) bool { return r.Destination == dest }}
}

// AnswerTo accepts the response to request requestID (the request's
// message id), sent with Delivery.Respond.
func AnswerTo(requestID string) Filter {
	return Filter{desc: "answering request " + requestID, match: func(r *Record) bool { return r.Headers[bus.HeaderRequestID] == requestID }}
}

// Where accepts messages whose body, decoded into a T, satisfies pred.
func Where[T any](pred func(T) bool) Filter {
	return Filter{desc: "matching a predicate", match: func(r *Record) bool {
		v, err := decode[T](r)
		return err == nil && pred(v)
	}}
}

// Msg is a record with its body decoded.
type Msg[T any] struct {
	Record
	Message T
}

// Consumed waits until a message of type T is handled with outcome
// committed (or what a WithOutcome filter says) and returns it; the test
// fails, with a report of what the bus did, when the wait times out.
func Consumed[T any](h *Harness, filters ...Filter) Msg[T] {
	h.t.Helper()
	return first(ConsumedN[T](h, 1, filters...))
}

// ConsumedN waits until n messages of type T are handled as Consumed
// says, and returns them in order.
func ConsumedN[T any](h *Harness, n int, filters ...Filter) []Msg[T] {
	h.t.Helper()
	if !hasOutcome(filters) {
		filters = append(filters, WithOutcome(bus.OutcomeCommitted))
	}
	return waitN[T](h, n, "consumed", KindHandled, filters)
}

// DeadLettered waits until a message of type T is dead-lettered; the
// record's Err is the reason and its Headers carry the fault headers.
func DeadLettered[T any](h *Harness, filters ...Filter) Msg[T] {
	h.t.Helper()
	return first(waitN[T](h, 1, "dead-lettered", KindHandled, append(filters, WithOutcome(bus.OutcomeDeadLettered))))
}

// Faulted waits until an attempt to consume a message of type T fails
// (retried, handed back for redelivery, or dead-lettered) and returns
// the first such record; Err is the failure.
func Faulted[T any](h *Harness, filters ...Filter) Msg[T] {
	h.t.Helper()
	f := Filter{desc: "failed", match: func(r *Record) bool { return r.Err != nil }}
	return first(waitN[T](h, 1, "faulted", 0, append(filters, f)))
}

// Published waits until a message of type T is published and known to be
// sent: confirmed by the transport, or written to the outbox by a
// transaction that committed (a consumer's delivery committed, or the
// relay delivered the row). With Relayed it waits for the relay.
func Published[T any](h *Harness, filters ...Filter) Msg[T] {
	h.t.Helper()
	return first(PublishedN[T](h, 1, filters...))
}

// Responded waits until a consumer's response of type T (Delivery.Respond
// to a request sent with bus.Request) is written by a transaction that
// committed, and returns it. AnswerTo narrows it to one request; Relayed
// waits until it left for the requester. A response rolled back with its
// consumer's attempt never counts.
func Responded[T any](h *Harness, filters ...Filter) Msg[T] {
	h.t.Helper()
	response := Filter{desc: "a response", match: func(r *Record) bool { return r.Headers[bus.HeaderRequestID] != "" }}
	return Published[T](h, append(filters, response)...)
}

// PublishedN waits until n messages of type T are published, as
// Published says, and returns them in order.
func PublishedN[T any](h *Harness, n int, filters ...Filter) []Msg[T] {
	h.t.Helper()
	committed := Filter{desc: "committed", match: func(r *Record) bool { return r.Committed }}
	return waitN[T](h, n, "published", KindPublished, append(filters, committed))
}

func hasOutcome(fs []Filter) bool {
	for _, f := range fs {
		if f.outcome {
			return true
		}
	}
	return false
}

func first[T any](ms []Msg[T]) Msg[T] {
	if len(ms) == 0 {
		return Msg[T]{}
	}
	return ms[0]
}

func waitN[T any](h *Harness, n int, verb string, kind Kind, filters []Filter) []Msg[T] {
	h.t.Helper()
	typ := typeOf[T]()
	descs := []string{}
	for _, f := range filters {
		descs = append(descs, f.desc)
	}
	what := fmt.Sprintf("%d %s %s %s", n, verb, typ, strings.Join(descs, ", "))
	var got []Msg[T]
	ok := h.wait(what, func() bool {
		got = got[:0]
		for _, r := range h.records {
			if (kind != 0 && r.Kind != kind) || (kind == 0 && r.Kind == KindPublished) || r.MessageType != typ {
				continue
			}
			if !all(filters, r) {
				continue
			}
			m := Msg[T]{Record: *r}
			m.Message, _ = decode[T](r)
			got = append(got, m)
			if len(got) == n {
				return true
			}
		}
		return false
	})
	if !ok {
		return nil
	}
	return got
}

func all(fs []Filter, r *Record) bool {
	for _, f := range fs {
		if !f.match(r) {
			return false
		}
	}
	return true
}

// wait evaluates cond (with h.mu held) at once and after every record,
// until it holds or the timeout passes; then it fails the test with a
// report.
func (h *Harness) wait(what string, cond func() bool) bool {
	h.t.Helper()
	d := h.timeout()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		h.mu.Lock()
		ok := cond()
		ch := h.changed
		h.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			h.t.Fatalf("bustest: timed out after %v waiting for %s\n%s", d, what, h.Report())
			return false
		}
	}
}

// WaitIdle waits until the bus has nothing left to do: no delivery in
// flight, no outbox row pending (a delayed redelivery is one), and (on the
// embedded default) no message queued or unacknowledged for an endpoint. On a broker the queues are not counted: wait for what you
// expect to be consumed instead.
func (h *Harness) WaitIdle() {
	h.t.Helper()
	d := h.timeout()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last bus.Backlog
	for {
		h.mu.Lock()
		ch := h.changed // before counting: whatever changes after it wakes us
		h.mu.Unlock()
		bl, err := h.Bus.Backlog(ctx)
		if err == nil && bl.Idle() {
			return
		}
		if err == nil {
			last = bl
		}
		select {
		case <-ch:
		case <-ctx.Done():
			h.t.Fatalf("bustest: timed out after %v waiting for the bus to be idle (last seen: %d in flight, %d queued, %d outbox rows pending; error %v)\n%s",
				d, last.InFlight, last.Queued, last.OutboxPending, err, h.Report())
			return
		}
	}
}

// Report describes what the bus did: deliveries by endpoint, type and
// outcome, and publications by type and state, then the last records.
func (h *Harness) Report() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var sb strings.Builder
	if len(h.records) == 0 {
		return "the bus handled and published nothing"
	}
	handled := map[string]int{}
	published := map[string]int{}
	for _, r := range h.records {
		switch r.Kind {
		case KindHandled, KindRetried:
			o := r.Outcome
			if r.Kind == KindRetried {
				o = "retried"
			}
			handled[fmt.Sprintf("%s  %s  %s", r.Endpoint, r.MessageType, o)]++
		case KindPublished:
			published[fmt.Sprintf("%s  %s  %s", r.MessageType, r.Destination, pubState(r))]++
		}
	}
	section := func(title string, m map[string]int) {
		if len(m) == 0 {
			return
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&sb, "%s:\n", title)
		for _, k := range keys {
			fmt.Fprintf(&sb, "  %dx  %s\n", m[k], k)
		}
	}
	section("consumed (endpoint, type, outcome)", handled)
	section("published (type, destination, state)", published)
	from := max(len(h.records)-20, 0)
	fmt.Fprintf(&sb, "last %d of %d records:\n", len(h.records)-from, len(h.records))
	for _, r := range h.records[from:] {
		fmt.Fprintf(&sb, "  %s\n", r)
	}
	return sb.String()
}

func pubState(r *Record) string {
	switch {
	case !r.Outbox && r.Committed:
		return "sent"
	case !r.Outbox && r.RolledBack:
		return "in a transaction, rolled back"
	case !r.Outbox:
		return "in a transaction"
	case r.Relayed:
		return "outbox, relayed"
	case r.RolledBack:
		return "outbox, rolled back"
	case r.Committed:
		return "outbox, committed"
	}
	return "outbox, written"
}

func (r *Record) String() string {
	switch r.Kind {
	case KindPublished:
		s := fmt.Sprintf("#%d published %s %s to %s (%s)", r.Seq, r.MessageType, r.MessageID, r.Destination, pubState(r))
		if r.ParentID != "" {
			s += fmt.Sprintf(" by %s/%s attempt %d", r.ParentEndpoint, r.ParentID, r.ParentAttempt)
		}
		return s
	case KindRetried:
		return fmt.Sprintf("#%d %s retried %s %s after attempt %d: %v", r.Seq, r.Endpoint, r.MessageType, r.MessageID, r.Attempt, r.Err)
	}
	s := fmt.Sprintf("#%d %s %s %s %s (attempt %d)", r.Seq, r.Endpoint, r.Outcome, r.MessageType, r.MessageID, r.Attempt)
	if r.Err != nil {
		s += ": " + r.Err.Error()
	}
	return s
}
