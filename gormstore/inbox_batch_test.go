package gormstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/pgerr"
	"github.com/barewire-go/barewire/outbox"
)

// batchItem is an item of a ProcessBatch whose consumer runs fn on the
// batch's transaction.
func batchItem(id string, l inbox.Lock, fn func(ctx context.Context) error) inbox.BatchItem {
	return inbox.BatchItem{MessageID: id, Token: l.Token, Ctx: context.Background(), Fn: fn}
}

func insertBusiness(business, id string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		tx, _ := gormstore.TxFromContext(ctx)
		return tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", id).Error
	}
}

// TestProcessBatchRoundTrips counts what a group-committed batch sends
// after its lock statement: BEGIN, the fence, a SAVEPOINT and the
// consumer's statement per item, the mark and COMMIT: 4 + 2n for n
// consumers of one Exec each (docs/inbox.md, the write path; a batch that
// sends fewer was built and measured, and did not show a gain:
// docs/benchmarks.md).
func TestProcessBatchRoundTrips(t *testing.T) {
	s, db, w, business := countedStore(t, true)
	ctx := context.Background()
	in := s.Inbox()
	for round, n := range []int{4, 4, 4} { // pgx prepares statements on their first use
		ids := make([]string, n)
		for i := range ids {
			ids[i] = "r" + string(rune('0'+round)) + "-" + string(rune('a'+i))
		}
		locks, err := in.TryLockBatch(ctx, "c", ids, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		its := make([]inbox.BatchItem, n)
		for i, id := range ids {
			its[i] = batchItem(id, locks[i], insertBusiness(business, id))
		}
		before := w.n.Load()
		for i, err := range in.ProcessBatch(ctx, "c", its, time.Time{}) {
			if err != nil {
				t.Fatalf("item %d: %v", i, err)
			}
		}
		if got, want := w.n.Load()-before, int64(4+2*n); round == 2 && got != want {
			t.Errorf("%d round trips for a batch of %d, want %d", got, n, want)
		}
	}
	if got := count(t, db, "SELECT count(*) FROM "+business); got != 12 {
		t.Errorf("%d business rows, want 12", got)
	}
	if got := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"inbox WHERE processed_at IS NOT NULL"); got != 12 {
		t.Errorf("%d processed entries, want 12", got)
	}
}

// TestProcessBatchItemsIsolated: each item's work in a batch stands or
// falls alone: a consumer that fails after its write, one that ignores a
// failed statement (its failure, reported as SQLSTATE 25P02, found by the
// next statement of the batch), one that runs no statement, one that reads
// first, and one whose published message must go with its rollback, among
// consumers that succeed; the failed ones' locks go with the commit.
func TestProcessBatchItemsIsolated(t *testing.T) {
	s, db, _, business := countedStore(t, true)
	ctx := context.Background()
	in := s.Inbox()
	ids := []string{"ok-1", "fails", "ignores", "nothing", "reads", "publishes-fails", "ok-2"}
	locks, err := in.TryLockBatch(ctx, "c", ids, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom after the write")
	fns := map[string]func(ctx context.Context) error{
		"ok-1": insertBusiness(business, "ok-1"),
		"fails": func(ctx context.Context) error {
			if err := insertBusiness(business, "fails")(ctx); err != nil {
				return err
			}
			return boom
		},
		"ignores": func(ctx context.Context) error {
			if err := insertBusiness(business, "ignores")(ctx); err != nil {
				return err
			}
			tx, _ := gormstore.TxFromContext(ctx)
			_ = tx.Exec("SELECT 1/0").Error // failed and ignored
			return nil
		},
		"nothing": func(ctx context.Context) error { return nil },
		"reads": func(ctx context.Context) error {
			tx, _ := gormstore.TxFromContext(ctx)
			var n int64
			if err := tx.Raw("SELECT count(*) FROM " + business).Scan(&n).Error; err != nil {
				return err
			}
			return insertBusiness(business, "reads")(ctx)
		},
		"publishes-fails": func(ctx context.Context) error {
			if err := s.Outbox().Add(ctx, []*outbox.Message{msg("out-publishes-fails", "T")}); err != nil {
				return err
			}
			if err := insertBusiness(business, "publishes-fails")(ctx); err != nil {
				return err
			}
			return boom
		},
		"ok-2": func(ctx context.Context) error {
			if err := s.Outbox().Add(ctx, []*outbox.Message{msg("out-ok-2", "T")}); err != nil {
				return err
			}
			return insertBusiness(business, "ok-2")(ctx)
		},
	}
	its := make([]inbox.BatchItem, len(ids))
	for i, id := range ids {
		its[i] = batchItem(id, locks[i], fns[id])
	}
	errs := in.ProcessBatch(ctx, "c", its, time.Time{})
	for i, id := range ids {
		switch id {
		case "fails", "publishes-fails":
			if !errors.Is(errs[i], boom) {
				t.Errorf("%s: %v, want its own error", id, errs[i])
			}
		case "ignores":
			var se *inbox.StoreError
			if !errors.As(errs[i], &se) || pgerr.SQLState(errs[i]) != "25P02" {
				t.Errorf("%s: %v, want a StoreError reading as SQLSTATE 25P02", id, errs[i])
			}
		default:
			if errs[i] != nil {
				t.Errorf("%s: %v", id, errs[i])
			}
		}
	}
	var rows []string
	if err := db.Raw("SELECT id FROM " + business + " ORDER BY id").Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if want := []string{"ok-1", "ok-2", "reads"}; !equalStrings(rows, want) {
		t.Errorf("business rows %v, want %v", rows, want)
	}
	var processed []string
	if err := db.Raw("SELECT message_id FROM " + s.TablePrefix() + "inbox WHERE processed_at IS NOT NULL ORDER BY message_id").Scan(&processed).Error; err != nil {
		t.Fatal(err)
	}
	if want := []string{"nothing", "ok-1", "ok-2", "reads"}; !equalStrings(processed, want) {
		t.Errorf("processed entries %v, want %v", processed, want)
	}
	var out []string
	if err := db.Raw("SELECT message_id FROM " + s.TablePrefix() + "outbox").Scan(&out).Error; err != nil {
		t.Fatal(err)
	}
	if want := []string{"out-ok-2"}; !equalStrings(out, want) {
		t.Errorf("outbox rows %v, want %v", out, want)
	}
	// The failed items' locks went with the commit: their retries lock at once.
	for _, id := range []string{"fails", "ignores", "publishes-fails"} {
		if l, err := in.TryLock(ctx, inbox.Key{MessageID: id, ConsumerType: "c"}, time.Minute); err != nil || l.State != inbox.Acquired {
			t.Errorf("retry of %s: %+v, %v; want acquired", id, l, err)
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
