package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/barewire-go/barewire/outbox"
)

// fakeStore records what the relay does with the rows of one claim; the
// methods the relay does not call here are left to the embedded nil Store.
type fakeStore struct {
	outbox.Store
	claim     []*outbox.Message
	delivered []int64
	releases  []release
	// markErr and releaseErr, when set, fail MarkDelivered and Release.
	markErr, releaseErr error
}

type release struct {
	ids          []int64
	countAttempt bool
	retryAfter   time.Duration
}

func (s *fakeStore) Claim(context.Context, string, int, time.Duration) ([]*outbox.Message, error) {
	c := s.claim
	s.claim = nil
	return c, nil
}

func (s *fakeStore) MarkDelivered(_ context.Context, _ string, ids []int64, _ bool) (int, error) {
	if s.markErr != nil {
		return 0, s.markErr
	}
	s.delivered = append(s.delivered, ids...)
	return len(ids), nil
}

func (s *fakeStore) Release(_ context.Context, _ string, ids []int64, _ string, count bool, after time.Duration, _ int) error {
	if s.releaseErr != nil {
		return s.releaseErr
	}
	s.releases = append(s.releases, release{slices.Clone(ids), count, after})
	return nil
}

type fakeTransport func(ctx context.Context, msgs []*outbox.Message) []error

func (f fakeTransport) Deliver(ctx context.Context, msgs []*outbox.Message) []error {
	return f(ctx, msgs)
}

// TestRelayRetryAfter: a *outbox.RetryAfterError releases the row without
// counting an attempt, claimable again after the transport's After, and it
// is not marked delivered; the pass is no failure (no backoff). The relay
// asks for such errors through the context.
func TestRelayRetryAfter(t *testing.T) {
	store := &fakeStore{claim: []*outbox.Message{{ID: 1, MessageID: "a"}, {ID: 2, MessageID: "b"}, {ID: 3, MessageID: "c"}}}
	var allowed bool
	tr := fakeTransport(func(ctx context.Context, msgs []*outbox.Message) []error {
		allowed = outbox.RetryAfterAllowed(ctx)
		suspect := fmt.Errorf("%w: confirm not trusted", outbox.ErrTransportUnavailable)
		return []error{nil,
			&outbox.RetryAfterError{After: 700 * time.Millisecond, Err: suspect},
			&outbox.RetryAfterError{After: 900 * time.Millisecond, Err: suspect}}
	})
	r := &outbox.Relay{Store: store, Transport: tr, Owner: "r1"}
	n, err := r.DispatchOnce(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("DispatchOnce = %d, %v; want 3, nil", n, err)
	}
	if !allowed {
		t.Error("the relay's Deliver context is not marked with outbox.WithRetryAfter")
	}
	if !slices.Equal(store.delivered, []int64{1}) {
		t.Errorf("delivered %v, want [1]", store.delivered)
	}
	want := []release{{ids: []int64{2, 3}, countAttempt: false, retryAfter: 900 * time.Millisecond}}
	if len(store.releases) != 1 || !slices.Equal(store.releases[0].ids, want[0].ids) ||
		store.releases[0].countAttempt || store.releases[0].retryAfter != want[0].retryAfter {
		t.Errorf("releases %+v, want %+v", store.releases, want)
	}
}

func TestRetryAfterError(t *testing.T) {
	err := error(&outbox.RetryAfterError{After: time.Second, Err: fmt.Errorf("x: %w", outbox.ErrTransportUnavailable)})
	if !errors.Is(err, outbox.ErrTransportUnavailable) {
		t.Error("RetryAfterError does not unwrap to its Err")
	}
	if outbox.RetryAfterAllowed(context.Background()) {
		t.Error("a plain context allows RetryAfterError")
	}
}

// TestRelayCountsRecordedDeliveriesWhenSettleFailsLater: a leased batch
// settles step by step. When its delivered rows were marked but a failed
// row's release then failed, the pass fails (the failed row waits for its
// lease) and the delivered rows are still reported to OnDelivered (the
// published-messages metric); when the mark itself failed they are not:
// they will be sent again.
func TestRelayCountsRecordedDeliveriesWhenSettleFailsLater(t *testing.T) {
	for _, c := range []struct {
		name             string
		markErr, relErr  error
		wantOnDelivered  []int64
		wantRecordedFlag bool
	}{
		{"release fails after the mark", nil, errors.New("release: connection reset"), []int64{1}, true},
		{"mark fails", errors.New("mark: connection reset"), nil, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &fakeStore{claim: []*outbox.Message{{ID: 1, MessageID: "a"}, {ID: 2, MessageID: "b"}},
				markErr: c.markErr, releaseErr: c.relErr}
			tr := fakeTransport(func(ctx context.Context, msgs []*outbox.Message) []error {
				return []error{nil, errors.New("broker refused b")}
			})
			var onDelivered []int64
			r := &outbox.Relay{Store: store, Transport: tr, Owner: "r1", OnDelivered: func(msgs []*outbox.Message) {
				for _, m := range msgs {
					onDelivered = append(onDelivered, m.ID)
				}
			}}
			_, err := r.DispatchOnce(context.Background())
			if err == nil {
				t.Fatal("DispatchOnce succeeded; want the settlement's failure")
			}
			if got := errors.Is(err, outbox.ErrDeliveredRecorded); got != c.wantRecordedFlag {
				t.Errorf("errors.Is(%v, ErrDeliveredRecorded) = %v, want %v", err, got, c.wantRecordedFlag)
			}
			if !slices.Equal(onDelivered, c.wantOnDelivered) {
				t.Errorf("OnDelivered got %v, want %v", onDelivered, c.wantOnDelivered)
			}
		})
	}
}
