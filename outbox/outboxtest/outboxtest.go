package outboxtest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/barewire-go/barewire/outbox"
)

// InTx runs fn in a new transaction, placed in fn's ctx the way the store's
// Add finds it; it commits when fn returns nil and rolls back otherwise,
// returning fn's error.
type InTx = func(ctx context.Context, fn func(ctx context.Context) error) error

// Option adapts the suite to what a store's database can do.
type Option func(*config)

type config struct {
	serial      bool
	idsAtCommit bool
}

// IDsAtCommit tells the suite that Add in the transactions inTx runs keeps
// the rows until the commit and inserts them with it (gormstore's
// Outbox.Begin): ids are drawn at commit, so an open transaction cannot
// hold a lower id than a later one that commits first, and the
// out-of-order-commit case, which needs one, is skipped.
func IDsAtCommit() Option {
	return func(c *config) { c.idsAtCommit = true }
}

// SerialTransactions tells the suite that the store's database runs one
// transaction at a time (SQLite through a single connection): the cases
// that need a second transaction while one is open, such as an
// out-of-order commit, are skipped.
func SerialTransactions() Option {
	return func(c *config) { c.serial = true }
}

// Lease and wait lengths. Short enough to keep the suite quick, long enough
// that a slow CI machine does not see a lease expire by accident.
const (
	shortLease = 300 * time.Millisecond
	longLease  = time.Minute
	waitLimit  = 10 * time.Second
	pollEvery  = 25 * time.Millisecond
)

// Run runs the conformance suite. newStore must return an empty store that
// is independent of every other store it returned, and a function that runs
// a transaction for it; it may register cleanup with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) (outbox.Store, InTx), opts ...Option) {
	t.Helper()
	var cfg config
	for _, opt := range opts {
		opt(&cfg)
	}
	cases := []struct {
		name       string
		fn         func(t *testing.T, s outbox.Store, inTx InTx)
		concurrent bool // needs two open transactions at once
	}{
		{"AddNeedsTransaction", testAddNeedsTransaction, false},
		{"CommitMakesVisible", testCommitMakesVisible, false},
		{"UncommittedInvisible", testUncommittedInvisible, true},
		{"RollbackDiscards", testRollbackDiscards, false},
		{"RoundTrip", testRoundTrip, false},
		{"ClaimLimit", testClaimLimit, false},
		{"MarkDelivered", testMarkDelivered, false},
		{"Release", testRelease, false},
		{"ReleaseRetryAfter", testReleaseRetryAfter, false},
		{"AddDelay", testAddDelay, false},
		{"ParkedDoNotBlock", testParkedDoNotBlock, false},
		{"ConcurrentClaimers", testConcurrentClaimers, false},
		{"LeaseExpiry", testLeaseExpiry, false},
		{"OutOfOrderCommit", testOutOfOrderCommit, true},
		{"Requeue", testRequeue, false},
		{"Cleanup", testCleanup, false},
		{"Stats", testStats, false},
		{"List", testList, false},
		{"ListScheduled", testListScheduled, false},
		{"ClaimSkipsFutureBacklog", testClaimSkipsFutureBacklog, false},
		{"CancelPending", testCancelPending, false},
		{"CancelInTransaction", testCancelInTransaction, false},
		{"CancelLeasedOrDelivered", testCancelLeasedOrDelivered, false},
		{"CancelOnlyWhatCannotHaveLeft", testCancelOnlyWhatCannotHaveLeft, false},
		{"NextDue", testNextDue, false},
		{"BatchSettle", testBatchSettle, false},
		{"BatchSettleDelete", testBatchSettleDelete, false},
		{"BatchHeld", testBatchHeld, false},
		{"BatchHoldExpiry", testBatchHoldExpiry, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.concurrent && cfg.serial {
				t.Skip("the store runs one transaction at a time (SerialTransactions)")
			}
			if c.name == "OutOfOrderCommit" && cfg.idsAtCommit {
				t.Skip("ids are drawn at commit (IDsAtCommit)")
			}
			s, inTx := newStore(t)
			c.fn(t, s, inTx)
		})
	}
}

var errRollback = errors.New("outboxtest: roll back")

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newMessages returns n messages with distinct ids "<tag>-<i>".
func newMessages(tag string, n int) []*outbox.Message {
	msgs := make([]*outbox.Message, n)
	for i := range msgs {
		msgs[i] = &outbox.Message{
			MessageID:   fmt.Sprintf("%s-%d", tag, i),
			Destination: "exchange:orders",
			RoutingKey:  "orders.created",
			MessageType: "OrderCreated",
			ContentType: "application/json",
			Payload:     fmt.Appendf(nil, `{"n":%d}`, i),
		}
	}
	return msgs
}

// add commits msgs in one transaction and returns their ids.
func add(t *testing.T, ctx context.Context, s outbox.Store, inTx InTx, msgs []*outbox.Message) []int64 {
	t.Helper()
	err := inTx(ctx, func(ctx context.Context) error { return s.Add(ctx, msgs) })
	if err != nil {
		t.Fatalf("Add in a transaction: %v", err)
	}
	ids := make([]int64, len(msgs))
	for i, m := range msgs {
		if m.ID <= 0 {
			t.Fatalf("Add left message %s without an ID", m.MessageID)
		}
		if i > 0 && m.ID <= msgs[i-1].ID {
			t.Fatalf("Add assigned ids out of order: %d after %d", m.ID, msgs[i-1].ID)
		}
		ids[i] = m.ID
	}
	return ids
}

func claim(t *testing.T, ctx context.Context, s outbox.Store, owner string, limit int, lease time.Duration) []*outbox.Message {
	t.Helper()
	got, err := s.Claim(ctx, owner, limit, lease)
	if err != nil {
		t.Fatalf("Claim(%s, %d): %v", owner, limit, err)
	}
	for i := 1; i < len(got); i++ {
		if got[i].ID <= got[i-1].ID {
			t.Fatalf("Claim returned ids out of order: %v", idsOf(got))
		}
	}
	return got
}

func idsOf(msgs []*outbox.Message) []int64 {
	ids := make([]int64, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

func wantIDs(t *testing.T, what string, got []*outbox.Message, want []int64) {
	t.Helper()
	if g := idsOf(got); !slices.Equal(g, want) {
		t.Fatalf("%s = ids %v, want %v", what, g, want)
	}
}

func markDelivered(t *testing.T, ctx context.Context, s outbox.Store, owner string, ids []int64, del bool, want int) {
	t.Helper()
	n, err := s.MarkDelivered(ctx, owner, ids, del)
	if err != nil {
		t.Fatalf("MarkDelivered(%s, %v, %v): %v", owner, ids, del, err)
	}
	if n != want {
		t.Fatalf("MarkDelivered(%s, %v, %v) changed %d rows, want %d", owner, ids, del, n, want)
	}
}

func list(t *testing.T, ctx context.Context, s outbox.Store, q outbox.Query) []*outbox.Message {
	t.Helper()
	got, err := s.List(ctx, q)
	if err != nil {
		t.Fatalf("List(%+v): %v", q, err)
	}
	return got
}

func byID(t *testing.T, ctx context.Context, s outbox.Store, id int64) *outbox.Message {
	t.Helper()
	got := list(t, ctx, s, outbox.Query{AfterID: id - 1, Limit: 1})
	if len(got) != 1 || got[0].ID != id {
		t.Fatalf("row %d not found", id)
	}
	return got[0]
}

func stats(t *testing.T, ctx context.Context, s outbox.Store) outbox.Stats {
	t.Helper()
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

func wantCounts(t *testing.T, ctx context.Context, s outbox.Store, pending, parked, delivered int64) {
	t.Helper()
	st := stats(t, ctx, s)
	if got := Delivered(t, ctx, s); st.Pending != pending || st.Parked != parked || got != delivered {
		t.Fatalf("Stats = pending %d, parked %d, and %d rows delivered; want %d, %d, %d",
			st.Pending, st.Parked, got, pending, parked, delivered)
	}
}

// Delivered counts s's delivered rows through List (Stats does not count
// them: they are history). It fails t if List does.
func Delivered(t testing.TB, ctx context.Context, s outbox.Store) int64 {
	t.Helper()
	var n, after int64
	for {
		rows, err := s.List(ctx, outbox.Query{Status: outbox.StatusDelivered, AfterID: after, Limit: 500})
		if err != nil {
			t.Fatalf("List delivered: %v", err)
		}
		n += int64(len(rows))
		if len(rows) < 500 {
			return n
		}
		after = rows[len(rows)-1].ID
	}
}

// claimEventually polls Claim until it returns rows, which must not happen
// before minWait has passed since start.
func claimEventually(t *testing.T, ctx context.Context, s outbox.Store, owner string, limit int, start time.Time, minWait time.Duration) []*outbox.Message {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		got := claim(t, ctx, s, owner, limit, longLease)
		if len(got) > 0 {
			if waited := time.Since(start); waited < minWait {
				t.Fatalf("Claim got rows after %v, before %v had passed", waited, minWait)
			}
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("Claim(%s) found nothing within %v", owner, waitLimit)
		}
		time.Sleep(pollEvery)
	}
}

func testAddNeedsTransaction(t *testing.T, s outbox.Store, _ InTx) {
	ctx := testCtx(t)
	err := s.Add(ctx, newMessages("m", 1))
	if !errors.Is(err, outbox.ErrNoTransaction) {
		t.Fatalf("Add without a transaction = %v, want ErrNoTransaction", err)
	}
	wantCounts(t, ctx, s, 0, 0, 0)
}

func testCommitMakesVisible(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	msgs := newMessages("m", 3)
	ids := add(t, ctx, s, inTx, msgs)
	for _, m := range msgs {
		if m.Status != outbox.StatusPending || m.CreatedAt.IsZero() {
			t.Errorf("Add left message %d with status %q, created %v", m.ID, m.Status, m.CreatedAt)
		}
	}
	got := claim(t, ctx, s, "relay-1", 10, longLease)
	wantIDs(t, "Claim after commit", got, ids)
	// Two Adds in one transaction are one commit.
	more := append(newMessages("x", 2), newMessages("y", 2)...)
	err := inTx(ctx, func(ctx context.Context) error {
		if err := s.Add(ctx, more[:2]); err != nil {
			return err
		}
		return s.Add(ctx, more[2:])
	})
	if err != nil {
		t.Fatalf("two Adds in one transaction: %v", err)
	}
	got = claim(t, ctx, s, "relay-1", 10, longLease)
	wantIDs(t, "Claim after the second commit", got, idsOf(more))
}

func testUncommittedInvisible(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	msgs := newMessages("m", 2)
	err := inTx(ctx, func(txCtx context.Context) error {
		if err := s.Add(txCtx, msgs); err != nil {
			return err
		}
		// Another transaction (the relay) must not see the rows yet.
		if got := claim(t, ctx, s, "relay-1", 10, longLease); len(got) != 0 {
			t.Errorf("Claim before commit returned ids %v", idsOf(got))
		}
		if got := list(t, ctx, s, outbox.Query{}); len(got) != 0 {
			t.Errorf("List before commit returned ids %v", idsOf(got))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("transaction: %v", err)
	}
	wantIDs(t, "Claim after commit", claim(t, ctx, s, "relay-1", 10, longLease), idsOf(msgs))
}

func testRollbackDiscards(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	err := inTx(ctx, func(ctx context.Context) error {
		if err := s.Add(ctx, newMessages("m", 3)); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("rolled-back transaction returned %v, want its error", err)
	}
	if got := claim(t, ctx, s, "relay-1", 10, longLease); len(got) != 0 {
		t.Fatalf("Claim after rollback returned ids %v", idsOf(got))
	}
	if got := list(t, ctx, s, outbox.Query{}); len(got) != 0 {
		t.Fatalf("List after rollback returned ids %v", idsOf(got))
	}
	wantCounts(t, ctx, s, 0, 0, 0)
	// The store keeps working after a rollback.
	ids := add(t, ctx, s, inTx, newMessages("n", 1))
	wantIDs(t, "Claim after a later commit", claim(t, ctx, s, "relay-1", 10, longLease), ids)
}

func testRoundTrip(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	full := &outbox.Message{
		MessageID:     "7c0a9a2e-message",
		Destination:   "queue:billing",
		RoutingKey:    "billing.charge",
		MessageType:   "ChargeCard",
		ContentType:   "application/octet-stream",
		CorrelationID: "corr-42",
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":  "",
			"x-unicode":   "héllo, 世界 ✓",
			"x-quotes":    `"quoted" \ back\slash`,
		},
		// Not UTF-8, with NUL bytes: payloads are bytes, not text.
		Payload: []byte{0x00, 0xff, 0xfe, 0x80, 'a', 0x00, 0xc3, 0x28, 0x7f},
	}
	bare := &outbox.Message{MessageID: "bare", Destination: "exchange:x"}
	ids := add(t, ctx, s, inTx, []*outbox.Message{full, bare})

	check := func(where string, got *outbox.Message, want *outbox.Message) {
		t.Helper()
		if got.ID != want.ID || got.MessageID != want.MessageID || got.Destination != want.Destination ||
			got.RoutingKey != want.RoutingKey || got.MessageType != want.MessageType ||
			got.ContentType != want.ContentType || got.CorrelationID != want.CorrelationID {
			t.Errorf("%s: row = %+v, want %+v", where, got, want)
		}
		if !bytes.Equal(got.Payload, want.Payload) {
			t.Errorf("%s: payload = %x, want %x", where, got.Payload, want.Payload)
		}
		if len(got.Headers) != len(want.Headers) || (len(want.Headers) > 0 && !maps.Equal(got.Headers, want.Headers)) {
			t.Errorf("%s: headers = %q, want %q", where, got.Headers, want.Headers)
		}
		if got.Status != outbox.StatusPending || got.Attempts != 0 || got.LastError != "" || got.DeliveredAt != nil {
			t.Errorf("%s: state = %q, %d attempts, error %q, delivered %v; want a fresh pending row",
				where, got.Status, got.Attempts, got.LastError, got.DeliveredAt)
		}
		if !got.CreatedAt.Equal(want.CreatedAt) {
			t.Errorf("%s: CreatedAt = %v, want %v as reported by Add", where, got.CreatedAt, want.CreatedAt)
		}
	}
	listed := list(t, ctx, s, outbox.Query{})
	wantIDs(t, "List", listed, ids)
	check("List", listed[0], full)
	check("List", listed[1], bare)
	claimed := claim(t, ctx, s, "relay-1", 10, longLease)
	wantIDs(t, "Claim", claimed, ids)
	check("Claim", claimed[0], full)
	check("Claim", claimed[1], bare)
}

func testClaimLimit(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 10))
	wantIDs(t, "first Claim(3)", claim(t, ctx, s, "relay-1", 3, longLease), ids[:3])
	// Rows leased to a live owner are skipped, by that owner too.
	wantIDs(t, "second Claim(3)", claim(t, ctx, s, "relay-2", 3, longLease), ids[3:6])
	wantIDs(t, "third Claim(3)", claim(t, ctx, s, "relay-1", 3, longLease), ids[6:9])
	wantIDs(t, "last Claim(3)", claim(t, ctx, s, "relay-2", 3, longLease), ids[9:])
	if got := claim(t, ctx, s, "relay-3", 3, longLease); len(got) != 0 {
		t.Fatalf("Claim with every row leased returned ids %v", idsOf(got))
	}
}

func testMarkDelivered(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 5))
	claim(t, ctx, s, "relay-1", 10, longLease)

	markDelivered(t, ctx, s, "relay-2", ids, false, 0) // not the owner
	markDelivered(t, ctx, s, "relay-2", ids, true, 0)
	wantCounts(t, ctx, s, 5, 0, 0)

	// A partial confirm: only the given ids change.
	markDelivered(t, ctx, s, "relay-1", ids[:2], false, 2)
	wantCounts(t, ctx, s, 3, 0, 2)
	for _, m := range list(t, ctx, s, outbox.Query{Status: outbox.StatusDelivered}) {
		if m.DeliveredAt == nil || m.DeliveredAt.Before(m.CreatedAt) {
			t.Errorf("delivered row %d has DeliveredAt %v (created %v)", m.ID, m.DeliveredAt, m.CreatedAt)
		}
	}
	// The unconfirmed rows stay leased to relay-1.
	if got := claim(t, ctx, s, "relay-2", 10, longLease); len(got) != 0 {
		t.Fatalf("Claim took rows still leased to another owner: %v", idsOf(got))
	}
	// Delivered rows are not marked again, and delete-on-deliver deletes.
	markDelivered(t, ctx, s, "relay-1", ids[:2], false, 0)
	markDelivered(t, ctx, s, "relay-1", ids[2:3], true, 1)
	wantCounts(t, ctx, s, 2, 0, 2)
	wantIDs(t, "List after delete", list(t, ctx, s, outbox.Query{}), []int64{ids[0], ids[1], ids[3], ids[4]})
	markDelivered(t, ctx, s, "relay-1", ids[3:], false, 2)
	wantCounts(t, ctx, s, 0, 0, 4)
	markDelivered(t, ctx, s, "relay-1", nil, false, 0)
}

func testRelease(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 3))
	claim(t, ctx, s, "relay-1", 10, longLease)

	// Another owner cannot release relay-1's rows.
	if err := s.Release(ctx, "relay-2", ids, "nope", true, 0, 5); err != nil {
		t.Fatalf("Release by another owner: %v", err)
	}
	if got := claim(t, ctx, s, "relay-2", 10, longLease); len(got) != 0 {
		t.Fatalf("rows released by a non-owner were claimable: %v", idsOf(got))
	}

	// Without counting (transport down): same attempts, no error recorded.
	if err := s.Release(ctx, "relay-1", ids[:1], "connection refused", false, 0, 2); err != nil {
		t.Fatalf("Release without counting: %v", err)
	}
	if m := byID(t, ctx, s, ids[0]); m.Attempts != 0 || m.Status != outbox.StatusPending {
		t.Errorf("row after an uncounted release: %d attempts, %q", m.Attempts, m.Status)
	}
	// Counting: attempts grow, the error is kept, the row stays pending
	// until maxAttempts.
	if err := s.Release(ctx, "relay-1", ids[1:], "broker rejected", true, 0, 2); err != nil {
		t.Fatalf("Release counting: %v", err)
	}
	for _, id := range ids[1:] {
		m := byID(t, ctx, s, id)
		if m.Attempts != 1 || m.LastError != "broker rejected" || m.Status != outbox.StatusPending {
			t.Errorf("row %d after one counted release: %d attempts, error %q, %q", id, m.Attempts, m.LastError, m.Status)
		}
	}
	got := claim(t, ctx, s, "relay-2", 10, longLease)
	wantIDs(t, "Claim after release", got, ids)
	// The second counted failure reaches maxAttempts = 2: parked.
	if err := s.Release(ctx, "relay-2", ids[1:2], "broker rejected again", true, 0, 2); err != nil {
		t.Fatalf("Release: %v", err)
	}
	m := byID(t, ctx, s, ids[1])
	if m.Status != outbox.StatusParked || m.Attempts != 2 || m.LastError != "broker rejected again" {
		t.Fatalf("row at maxAttempts: %q, %d attempts, error %q; want parked, 2", m.Status, m.Attempts, m.LastError)
	}
	wantCounts(t, ctx, s, 2, 1, 0)
	// A parked row is no longer leased: its owner cannot mark it.
	markDelivered(t, ctx, s, "relay-2", ids[1:2], false, 0)
	if err := s.Release(ctx, "relay-2", []int64{ids[0], ids[2]}, "", false, 0, 2); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantIDs(t, "Claim skipping the parked row", claim(t, ctx, s, "relay-3", 10, longLease), []int64{ids[0], ids[2]})
	if err := s.Release(ctx, "relay-3", nil, "", true, 0, 2); err != nil {
		t.Fatalf("Release of no ids: %v", err)
	}
}

func testReleaseRetryAfter(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 3))
	claim(t, ctx, s, "relay-1", 10, longLease)
	start := time.Now()
	const backoff = 400 * time.Millisecond
	if err := s.Release(ctx, "relay-1", ids[:1], "nack", true, backoff, 10); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Uncounted with a retryAfter (a *RetryAfterError): held back too,
	// without an attempt.
	if err := s.Release(ctx, "relay-1", ids[1:2], "", false, backoff, 10); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Uncounted without one: claimable at once.
	if err := s.Release(ctx, "relay-1", ids[2:], "", false, 0, 10); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantIDs(t, "Claim during the backoff", claim(t, ctx, s, "relay-2", 10, longLease), ids[2:])
	got := claimEventually(t, ctx, s, "relay-2", 10, start, backoff-100*time.Millisecond)
	if len(got) == 1 { // released a moment apart: due a moment apart
		got = append(got, claimEventually(t, ctx, s, "relay-2", 10, start, backoff-100*time.Millisecond)...)
	}
	slices.SortFunc(got, func(a, b *outbox.Message) int { return cmp.Compare(a.ID, b.ID) })
	wantIDs(t, "Claim after the backoff", got, ids[:2])
	if len(got) == 2 && got[0].Attempts != 1 || got[1].Attempts != 0 {
		t.Errorf("attempts after the backoff = %d, %d; want 1 (counted), 0 (not counted)", got[0].Attempts, got[1].Attempts)
	}
}

// testAddDelay: a row added with a Delay is not claimable before it has
// passed (the database's clock), rows without one are, and a negative
// Delay is refused.
func testAddDelay(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	const delay = 600 * time.Millisecond
	msgs := newMessages("d", 2)
	msgs[0].Delay = delay
	start := time.Now()
	ids := add(t, ctx, s, inTx, msgs)
	wantIDs(t, "Claim before the delay", claim(t, ctx, s, "relay-1", 10, longLease), ids[1:])
	got := claimEventually(t, ctx, s, "relay-1", 10, start, delay-100*time.Millisecond)
	wantIDs(t, "Claim after the delay", got, ids[:1])
	if got[0].Delay != 0 {
		t.Errorf("claimed row has Delay %v; rows read back leave it zero", got[0].Delay)
	}

	bad := newMessages("neg", 1)
	bad[0].Delay = -time.Second
	err := inTx(ctx, func(ctx context.Context) error { return s.Add(ctx, bad) })
	if err == nil || !strings.Contains(err.Error(), "Delay") {
		t.Errorf("Add with a negative Delay = %v, want an error naming Delay", err)
	}
}

func testParkedDoNotBlock(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 4))
	// The oldest row fails once with maxAttempts 1: parked at once.
	wantIDs(t, "Claim(1)", claim(t, ctx, s, "relay-1", 1, longLease), ids[:1])
	if err := s.Release(ctx, "relay-1", ids[:1], "poison", true, time.Minute, 1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantIDs(t, "Claim behind a parked row", claim(t, ctx, s, "relay-1", 10, longLease), ids[1:])
	markDelivered(t, ctx, s, "relay-1", ids[1:], false, 3)
	wantCounts(t, ctx, s, 0, 1, 3)
	if got := claim(t, ctx, s, "relay-1", 10, longLease); len(got) != 0 {
		t.Fatalf("Claim returned a parked row: %v", idsOf(got))
	}
}

func testConcurrentClaimers(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	const rows, relays, batch = 500, 4, 7
	ids := add(t, ctx, s, inTx, newMessages("m", rows))

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		seen  = map[int64]string{}
		errs  []error
		start = make(chan struct{})
	)
	for r := range relays {
		owner := fmt.Sprintf("relay-%d", r)
		wg.Go(func() {
			<-start
			for {
				got, err := s.Claim(ctx, owner, batch, longLease)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, m := range got {
					if prev, dup := seen[m.ID]; dup {
						errs = append(errs, fmt.Errorf("row %d claimed by %s and %s", m.ID, prev, owner))
					}
					seen[m.ID] = owner
				}
				mu.Unlock()
				n, err := s.MarkDelivered(ctx, owner, idsOf(got), false)
				if err == nil && n != len(got) {
					err = fmt.Errorf("%s confirmed %d rows, %d marked", owner, len(got), n)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent claimers: %v", errors.Join(errs...))
	}
	if len(seen) != rows {
		t.Fatalf("%d of %d rows were claimed", len(seen), rows)
	}
	for _, id := range ids {
		if _, ok := seen[id]; !ok {
			t.Fatalf("row %d never claimed", id)
		}
	}
	wantCounts(t, ctx, s, 0, 0, rows)
}

func testLeaseExpiry(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 3))
	start := time.Now()
	wantIDs(t, "Claim with a short lease", claim(t, ctx, s, "relay-1", 10, shortLease), ids)
	if got := claim(t, ctx, s, "relay-2", 10, longLease); len(got) != 0 {
		t.Fatalf("Claim during a live lease returned %v", idsOf(got))
	}
	got := claimEventually(t, ctx, s, "relay-2", 10, start, shortLease-50*time.Millisecond)
	wantIDs(t, "Claim after the lease expired", got, ids)
	// The first owner lost its lease: its late confirm changes nothing.
	markDelivered(t, ctx, s, "relay-1", ids, false, 0)
	markDelivered(t, ctx, s, "relay-2", ids, false, 3)
}

func testOutOfOrderCommit(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	early := newMessages("early", 1)
	late := newMessages("late", 1)

	added := make(chan struct{})
	commit := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- inTx(ctx, func(ctx context.Context) error {
			if err := s.Add(ctx, early); err != nil {
				close(added)
				return err
			}
			close(added)
			select {
			case <-commit:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	<-added
	// A later transaction commits first...
	add(t, ctx, s, inTx, late)
	if early[0].ID == 0 || late[0].ID <= early[0].ID {
		close(commit)
		<-done
		t.Fatalf("ids: early %d, late %d; the open transaction should hold the lower id", early[0].ID, late[0].ID)
	}
	// ... and is relayed while the earlier one is still open.
	got := claim(t, ctx, s, "relay-1", 10, longLease)
	wantIDs(t, "Claim while the earlier transaction is open", got, []int64{late[0].ID})
	markDelivered(t, ctx, s, "relay-1", idsOf(got), false, 1)

	close(commit)
	if err := <-done; err != nil {
		t.Fatalf("late-committing transaction: %v", err)
	}
	// The lower id that committed late is not skipped.
	wantIDs(t, "Claim after the late commit", claim(t, ctx, s, "relay-1", 10, longLease), []int64{early[0].ID})
}

func testRequeue(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 4))
	claim(t, ctx, s, "relay-1", 3, longLease)
	// Park the first three (maxAttempts 1); the fourth stays pending.
	if err := s.Release(ctx, "relay-1", ids[:3], "poison", true, 0, 1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantCounts(t, ctx, s, 1, 3, 0)

	n, err := s.Requeue(ctx, []int64{ids[0], ids[3]}) // ids[3] is not parked
	if err != nil || n != 1 {
		t.Fatalf("Requeue(one parked, one pending) = %d, %v; want 1", n, err)
	}
	m := byID(t, ctx, s, ids[0])
	if m.Status != outbox.StatusPending || m.Attempts != 0 {
		t.Fatalf("requeued row: %q, %d attempts; want pending, 0", m.Status, m.Attempts)
	}
	wantIDs(t, "Claim after Requeue", claim(t, ctx, s, "relay-2", 10, longLease), []int64{ids[0], ids[3]})

	n, err = s.Requeue(ctx, nil)
	if err != nil || n != 2 {
		t.Fatalf("Requeue(all) = %d, %v; want 2", n, err)
	}
	n, err = s.Requeue(ctx, nil)
	if err != nil || n != 0 {
		t.Fatalf("Requeue(all) with nothing parked = %d, %v; want 0", n, err)
	}
	wantCounts(t, ctx, s, 4, 0, 0)
	wantIDs(t, "Claim after Requeue(all)", claim(t, ctx, s, "relay-3", 10, longLease), ids[1:3])
}

func testCleanup(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	const retention = time.Second
	old := add(t, ctx, s, inTx, newMessages("old", 3))
	pending := add(t, ctx, s, inTx, newMessages("pending", 1))
	parked := add(t, ctx, s, inTx, newMessages("parked", 1))
	claim(t, ctx, s, "relay-1", 10, longLease)
	markDelivered(t, ctx, s, "relay-1", old, false, 3)
	if err := s.Release(ctx, "relay-1", pending, "", false, 0, 1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := s.Release(ctx, "relay-1", parked, "poison", true, 0, 1); err != nil {
		t.Fatalf("Release: %v", err)
	}

	time.Sleep(retention + 500*time.Millisecond)

	recent := add(t, ctx, s, inTx, newMessages("recent", 1))
	wantIDs(t, "Claim", claim(t, ctx, s, "relay-1", 10, longLease), append(pending, recent...))
	markDelivered(t, ctx, s, "relay-1", recent, false, 1)

	for i, want := range []int{2, 1, 0} {
		n, err := s.Cleanup(ctx, retention, 2)
		if err != nil {
			t.Fatalf("Cleanup #%d: %v", i+1, err)
		}
		if n != want {
			t.Fatalf("Cleanup #%d with batch 2 deleted %d, want %d", i+1, n, want)
		}
	}
	wantIDs(t, "List after cleanup", list(t, ctx, s, outbox.Query{}), []int64{pending[0], parked[0], recent[0]})
}

func testStats(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	if st := stats(t, ctx, s); st != (outbox.Stats{}) {
		t.Fatalf("Stats of an empty store = %+v", st)
	}
	first := add(t, ctx, s, inTx, newMessages("a", 2))
	time.Sleep(5 * time.Millisecond)
	second := add(t, ctx, s, inTx, newMessages("b", 3))

	st := stats(t, ctx, s)
	oldest := byID(t, ctx, s, first[0]).CreatedAt
	if st.Pending != 5 || st.Parked != 0 || !st.OldestPending.Equal(oldest) {
		t.Fatalf("Stats = %+v, want 5 pending, oldest created %v", st, oldest)
	}

	claim(t, ctx, s, "relay-1", 10, longLease)
	markDelivered(t, ctx, s, "relay-1", first, false, 2)
	if err := s.Release(ctx, "relay-1", second[:1], "poison", true, 0, 1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	st = stats(t, ctx, s)
	oldest = byID(t, ctx, s, second[1]).CreatedAt
	if st.Pending != 2 || st.Parked != 1 || !st.OldestPending.Equal(oldest) {
		t.Fatalf("Stats = %+v, want 2 pending, 1 parked, oldest pending created %v", st, oldest)
	}
	markDelivered(t, ctx, s, "relay-1", second[1:], true, 2)
	if st = stats(t, ctx, s); !st.OldestPending.IsZero() || st.Pending != 0 {
		t.Fatalf("Stats with nothing pending = %+v, want zero OldestPending", st)
	}
	// A row scheduled for later is pending and Scheduled, but not late.
	later := newMessages("later", 1)
	later[0].Delay = time.Hour
	add(t, ctx, s, inTx, later)
	if st = stats(t, ctx, s); st.Pending != 1 || st.Scheduled != 1 || !st.OldestPending.IsZero() {
		t.Fatalf("Stats with one row scheduled an hour ahead = %+v, want 1 pending, 1 scheduled, zero OldestPending", st)
	}
	// A failed row waiting an hour for its retry is late, not scheduled.
	failed := add(t, ctx, s, inTx, newMessages("failed", 1))
	wantIDs(t, "Claim", claim(t, ctx, s, "relay-1", 10, longLease), failed)
	if err := s.Release(ctx, "relay-1", failed, "nack", true, time.Hour, 10); err != nil {
		t.Fatalf("Release: %v", err)
	}
	created := byID(t, ctx, s, failed[0]).CreatedAt
	if st = stats(t, ctx, s); st.Pending != 2 || st.Scheduled != 1 || !st.OldestPending.Equal(created) {
		t.Fatalf("Stats with a failed row waiting for its retry = %+v, want 2 pending, 1 scheduled, OldestPending %v", st, created)
	}
	if got := list(t, ctx, s, outbox.Query{Scheduled: true}); len(got) != 1 || got[0].MessageID != "later-0" {
		t.Fatalf("List(Scheduled) = %v; want only the scheduled row, not the failed one", idsOf(got))
	}
}

func testList(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("m", 7))
	claim(t, ctx, s, "relay-1", 10, longLease)
	markDelivered(t, ctx, s, "relay-1", ids[:3], false, 3)
	if err := s.Release(ctx, "relay-1", ids[3:4], "poison", true, 0, 1); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := s.Release(ctx, "relay-1", ids[4:], "", false, 0, 1); err != nil {
		t.Fatalf("Release: %v", err)
	}

	wantIDs(t, "List()", list(t, ctx, s, outbox.Query{}), ids)
	wantIDs(t, "List(delivered)", list(t, ctx, s, outbox.Query{Status: outbox.StatusDelivered}), ids[:3])
	wantIDs(t, "List(parked)", list(t, ctx, s, outbox.Query{Status: outbox.StatusParked}), ids[3:4])
	wantIDs(t, "List(pending)", list(t, ctx, s, outbox.Query{Status: outbox.StatusPending}), ids[4:])
	wantIDs(t, "List(limit 2)", list(t, ctx, s, outbox.Query{Limit: 2}), ids[:2])
	wantIDs(t, "List(after, limit 2)", list(t, ctx, s, outbox.Query{AfterID: ids[1], Limit: 2}), ids[2:4])
	wantIDs(t, "List(pending after)", list(t, ctx, s, outbox.Query{Status: outbox.StatusPending, AfterID: ids[4]}), ids[5:])
	wantIDs(t, "List(after last)", list(t, ctx, s, outbox.Query{AfterID: ids[6]}), nil)

	// Paging by AfterID walks every row once.
	var paged []int64
	var after int64
	for {
		page := list(t, ctx, s, outbox.Query{AfterID: after, Limit: 3})
		if len(page) == 0 {
			break
		}
		paged = append(paged, idsOf(page)...)
		after = page[len(page)-1].ID
	}
	if !slices.Equal(paged, ids) {
		t.Fatalf("paging returned ids %v, want %v", paged, ids)
	}

	// Defaults to 100 rows.
	more := add(t, ctx, s, inTx, newMessages("bulk", 120))
	if got := list(t, ctx, s, outbox.Query{}); len(got) != 100 {
		t.Fatalf("List with no limit returned %d rows, want 100", len(got))
	}
	if got := list(t, ctx, s, outbox.Query{AfterID: more[len(more)-2]}); len(got) != 1 {
		t.Fatalf("List after the second-to-last row returned %d rows, want 1", len(got))
	}
}

// testListScheduled: Query.Scheduled lists pending rows not yet due, with
// AvailableAt in the future, and not the rows due now.
func testListScheduled(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	msgs := newMessages("s", 3)
	msgs[0].Delay = time.Hour
	msgs[2].Delay = 2 * time.Hour
	ids := add(t, ctx, s, inTx, msgs)
	got := list(t, ctx, s, outbox.Query{Scheduled: true})
	wantIDs(t, "List(Scheduled)", got, []int64{ids[0], ids[2]})
	for i, m := range got {
		if m.Status != outbox.StatusPending {
			t.Errorf("scheduled row %d has status %q, want pending", m.ID, m.Status)
		}
		if ahead := time.Until(m.AvailableAt); ahead < 50*time.Minute || ahead > 3*time.Hour {
			t.Errorf("scheduled row %d: AvailableAt %v is %v from now; want about %v", m.ID, m.AvailableAt, ahead, []time.Duration{time.Hour, 2 * time.Hour}[i])
		}
	}
	all := list(t, ctx, s, outbox.Query{})
	if len(all) != 3 || all[1].AvailableAt.IsZero() {
		t.Fatalf("List() = %d rows (AvailableAt of the due one %v); want 3 with AvailableAt set", len(all), all[1].AvailableAt)
	}
}

// testClaimSkipsFutureBacklog: rows scheduled in the future, however many
// and however old their ids, never hide rows that are due.
func testClaimSkipsFutureBacklog(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	future := newMessages("future", 300)
	for _, m := range future {
		m.Delay = time.Hour
	}
	add(t, ctx, s, inTx, future)
	due := add(t, ctx, s, inTx, newMessages("due", 5))
	wantIDs(t, "Claim(2) behind 300 future rows", claim(t, ctx, s, "relay-1", 2, longLease), due[:2])
	wantIDs(t, "Claim(10) behind 300 future rows", claim(t, ctx, s, "relay-1", 10, longLease), due[2:])
}

// testCancelPending: Cancel removes a pending row by message id, counts it
// once, and leaves other rows alone.
func testCancelPending(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	msgs := newMessages("c", 2)
	msgs[0].Delay = time.Hour
	ids := add(t, ctx, s, inTx, msgs)
	n, err := s.Cancel(ctx, "c-0")
	if err != nil || n != 1 {
		t.Fatalf("Cancel(c-0) = %d, %v; want 1, nil", n, err)
	}
	n, err = s.Cancel(ctx, "c-0")
	if err != nil || n != 0 {
		t.Fatalf("second Cancel(c-0) = %d, %v; want 0, nil", n, err)
	}
	if n, err := s.Cancel(ctx, "no-such-message"); err != nil || n != 0 {
		t.Fatalf("Cancel(no-such-message) = %d, %v; want 0, nil", n, err)
	}
	wantIDs(t, "List after Cancel", list(t, ctx, s, outbox.Query{}), ids[1:])
	if _, err := s.Cancel(ctx, ""); err == nil {
		t.Error("Cancel(\"\") = nil error, want one naming the empty message id")
	}
}

// testCancelInTransaction: a Cancel in a transaction that rolls back
// cancels nothing; one that commits cancels.
func testCancelInTransaction(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	msgs := newMessages("ct", 1)
	msgs[0].Delay = time.Hour
	add(t, ctx, s, inTx, msgs)
	err := inTx(ctx, func(ctx context.Context) error {
		n, err := s.Cancel(ctx, "ct-0")
		if err != nil || n != 1 {
			return fmt.Errorf("cancel in transaction = %d, %v; want 1, nil", n, err)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	if got := list(t, ctx, s, outbox.Query{Scheduled: true}); len(got) != 1 {
		t.Fatalf("after a rolled-back Cancel, %d scheduled rows; want 1", len(got))
	}
	err = inTx(ctx, func(ctx context.Context) error {
		n, err := s.Cancel(ctx, "ct-0")
		if err != nil || n != 1 {
			return fmt.Errorf("cancel in transaction = %d, %v; want 1, nil", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantCounts(t, ctx, s, 0, 0, 0)
}

// testCancelLeasedOrDelivered: a row a relay holds under a live lease, or
// one already delivered, is not cancelled.
func testCancelLeasedOrDelivered(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("cl", 2))
	wantIDs(t, "Claim", claim(t, ctx, s, "relay-1", 10, longLease), ids)
	if n, err := s.Cancel(ctx, "cl-0"); err != nil || n != 0 {
		t.Fatalf("Cancel of a leased row = %d, %v; want 0, nil", n, err)
	}
	markDelivered(t, ctx, s, "relay-1", ids, false, 2)
	if n, err := s.Cancel(ctx, "cl-1"); err != nil || n != 0 {
		t.Fatalf("Cancel of a delivered row = %d, %v; want 0, nil", n, err)
	}
	wantCounts(t, ctx, s, 0, 0, 2)
}

// testCancelOnlyWhatCannotHaveLeft (issue 33, item 5): Cancel removes only
// rows that can no longer reach the broker: not yet due, never failed,
// never published. A due row may be on its way (a relay published it and
// its settlement failed, leaving it pending); a row released by a
// *RetryAfterError was published. Cancel leaves both, and says so.
func testCancelOnlyWhatCannotHaveLeft(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	msgs := newMessages("cx", 3)
	msgs[2].Delay = time.Hour
	ids := add(t, ctx, s, inTx, msgs)
	if n, err := s.Cancel(ctx, "cx-0"); err != nil || n != 0 {
		t.Fatalf("Cancel of a due row = %d, %v; want 0 (a relay may have published it already)", n, err)
	}
	// cx-1 is published and its confirm not trusted: settled for later,
	// in a held batch where the store holds them, a leased one otherwise.
	batch, err := outbox.ClaimBatch(ctx, s, "relay-1", 10, longLease)
	if err != nil {
		t.Fatalf("ClaimBatch: %v", err)
	}
	if got := len(batch.Messages()); got != 2 {
		t.Fatalf("ClaimBatch took %d rows, want the 2 due", got)
	}
	if err := batch.Settle(ctx, outbox.Settlement{Later: ids[1:2], LaterAfter: time.Hour}); err != nil {
		t.Fatalf("Settle for later: %v", err)
	}
	if n, err := s.Cancel(ctx, "cx-1"); err != nil || n != 0 {
		t.Fatalf("Cancel of a row released by a RetryAfterError = %d, %v; want 0 (it was published)", n, err)
	}
	if n, err := s.Cancel(ctx, "cx-2"); err != nil || n != 1 {
		t.Fatalf("Cancel of a row scheduled for later = %d, %v; want 1", n, err)
	}
}

// testNextDue: NextDue reports the wait until the earliest future row, and
// nothing when no pending row lies in the future.
func testNextDue(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	if _, ok, err := s.NextDue(ctx); err != nil || ok {
		t.Fatalf("NextDue on an empty store = ok %v, %v; want false, nil", ok, err)
	}
	add(t, ctx, s, inTx, newMessages("now", 1))
	if _, ok, err := s.NextDue(ctx); err != nil || ok {
		t.Fatalf("NextDue with only a due row = ok %v, %v; want false, nil", ok, err)
	}
	msgs := newMessages("later", 2)
	msgs[0].Delay = 2 * time.Hour
	msgs[1].Delay = 30 * time.Minute
	add(t, ctx, s, inTx, msgs)
	d, ok, err := s.NextDue(ctx)
	if err != nil || !ok || d < 29*time.Minute || d > 30*time.Minute+time.Second {
		t.Fatalf("NextDue = %v, ok %v, %v; want about 30m", d, ok, err)
	}
}

// claimBatch claims a batch the way the relay does (outbox.ClaimBatch)
// and checks its order.
func claimBatch(t *testing.T, ctx context.Context, s outbox.Store, owner string, limit int, hold time.Duration) outbox.Batch {
	t.Helper()
	b, err := outbox.ClaimBatch(ctx, s, owner, limit, hold)
	if err != nil {
		t.Fatalf("ClaimBatch(%s, %d): %v", owner, limit, err)
	}
	got := b.Messages()
	for i := 1; i < len(got); i++ {
		if got[i].ID <= got[i-1].ID {
			t.Fatalf("ClaimBatch returned ids out of order: %v", idsOf(got))
		}
	}
	return b
}

func settle(t *testing.T, ctx context.Context, b outbox.Batch, st outbox.Settlement) {
	t.Helper()
	if err := b.Settle(ctx, st); err != nil {
		t.Fatalf("Settle(%+v): %v", st, err)
	}
}

// testBatchSettle: one settlement records every outcome: delivered rows
// are marked, a failed row counts an attempt (and is parked at its
// MaxAttempts), a row for later waits, and a row not named is claimable
// again at once, uncounted.
func testBatchSettle(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("bs", 6))
	b := claimBatch(t, ctx, s, "relay-1", 10, longLease)
	wantIDs(t, "ClaimBatch", b.Messages(), ids)
	settle(t, ctx, b, outbox.Settlement{
		Delivered: ids[0:2],
		Failed: []outbox.FailedRow{
			{ID: ids[2], Error: "nack: no route", RetryAfter: time.Hour, MaxAttempts: 5},
			{ID: ids[3], Error: "undeliverable", MaxAttempts: 1},
		},
		Later:      ids[4:5],
		LaterAfter: time.Hour,
	})
	wantCounts(t, ctx, s, 3, 1, 2)
	if m := byID(t, ctx, s, ids[0]); m.Status != outbox.StatusDelivered || m.DeliveredAt == nil {
		t.Fatalf("delivered row: status %s, delivered at %v", m.Status, m.DeliveredAt)
	}
	if m := byID(t, ctx, s, ids[2]); m.Status != outbox.StatusPending || m.Attempts != 1 || m.LastError != "nack: no route" {
		t.Fatalf("failed row: status %s, attempts %d, last error %q; want pending, 1, the error", m.Status, m.Attempts, m.LastError)
	}
	if m := byID(t, ctx, s, ids[3]); m.Status != outbox.StatusParked || m.Attempts != 1 {
		t.Fatalf("row failed at its MaxAttempts: status %s, attempts %d; want parked, 1", m.Status, m.Attempts)
	}
	if m := byID(t, ctx, s, ids[4]); m.Attempts != 0 || !m.AvailableAt.After(m.CreatedAt.Add(50*time.Minute)) {
		t.Fatalf("row for later: attempts %d, available at %v (created %v); want 0, an hour on", m.Attempts, m.AvailableAt, m.CreatedAt)
	}
	// Only the row the settlement did not name is claimable now, uncounted.
	got := claim(t, ctx, s, "relay-2", 10, longLease)
	wantIDs(t, "Claim after the settlement", got, ids[5:6])
	if got[0].Attempts != 0 {
		t.Fatalf("row not named in the settlement has %d attempts, want 0", got[0].Attempts)
	}
}

func testBatchSettleDelete(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("bd", 3))
	b := claimBatch(t, ctx, s, "relay-1", 10, longLease)
	settle(t, ctx, b, outbox.Settlement{Delivered: ids[:2], Delete: true})
	wantCounts(t, ctx, s, 1, 0, 0)
	if got := list(t, ctx, s, outbox.Query{}); len(got) != 1 || got[0].ID != ids[2] {
		t.Fatalf("rows left = %v, want [%d]", idsOf(got), ids[2])
	}
}

// testBatchHeld: while a batch is unsettled no other claim takes its rows
// and Cancel leaves them (at once, without waiting for the batch); an
// empty settlement gives every row back at once.
func testBatchHeld(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("bh", 3))
	b := claimBatch(t, ctx, s, "relay-1", 2, longLease)
	wantIDs(t, "ClaimBatch", b.Messages(), ids[:2])
	other := claimBatch(t, ctx, s, "relay-2", 10, longLease)
	wantIDs(t, "ClaimBatch beside an unsettled batch", other.Messages(), ids[2:])
	settle(t, ctx, other, outbox.Settlement{})
	if got := claim(t, ctx, s, "relay-3", 10, longLease); !slices.Equal(idsOf(got), ids[2:]) {
		t.Fatalf("Claim beside an unsettled batch = %v, want %v", idsOf(got), ids[2:])
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if n, err := s.Cancel(cctx, "bh-0"); err != nil || n != 0 {
		t.Fatalf("Cancel of a row in an unsettled batch = %d, %v; want 0, nil", n, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Cancel of a row in an unsettled batch took %v: it waited for the batch", d)
	}
	settle(t, ctx, b, outbox.Settlement{})
	b2 := claimBatch(t, ctx, s, "relay-2", 10, longLease)
	wantIDs(t, "ClaimBatch after an empty settlement", b2.Messages(), ids[:2])
	for _, m := range b2.Messages() {
		if m.Attempts != 0 {
			t.Fatalf("row %d has %d attempts after an empty settlement, want 0", m.ID, m.Attempts)
		}
	}
	settle(t, ctx, b2, outbox.Settlement{Delivered: ids[:2]})
	wantCounts(t, ctx, s, 1, 0, 2)
}

// testBatchHoldExpiry: a batch left unsettled past its hold (a relay that
// froze) gives its rows back; its late settlement then records nothing
// over the relay that took them.
func testBatchHoldExpiry(t *testing.T, s outbox.Store, inTx InTx) {
	ctx := testCtx(t)
	ids := add(t, ctx, s, inTx, newMessages("be", 3))
	start := time.Now()
	stale := claimBatch(t, ctx, s, "relay-1", 10, shortLease)
	wantIDs(t, "ClaimBatch with a short hold", stale.Messages(), ids)
	got := claimEventually(t, ctx, s, "relay-2", 10, start, shortLease-50*time.Millisecond)
	wantIDs(t, "Claim after the hold expired", got, ids)
	// The late settlement may fail or record nothing; either way the rows
	// stay relay-2's.
	_ = stale.Settle(ctx, outbox.Settlement{Delivered: ids, Failed: nil})
	wantCounts(t, ctx, s, 3, 0, 0)
	markDelivered(t, ctx, s, "relay-2", ids, false, 3)
}
