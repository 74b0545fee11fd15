package gormstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/outbox/outboxtest"
)

// deferredTx is the outbox suite's transaction runner through Outbox.Begin:
// the rows an Add keeps go in with the COMMIT.
func deferredTx(t *testing.T, db *gorm.DB, out *gormstore.Outbox) outboxtest.InTx {
	return func(ctx context.Context, fn func(ctx context.Context) error) error {
		tx, err := out.Begin(ctx, db)
		if err != nil {
			return err
		}
		if tx == nil {
			t.Fatal("Begin: no deferred transaction on PostgreSQL with postgresdb.Open")
		}
		d := gormstore.DeferredOf(tx)
		if err := fn(gormstore.WithTx(ctx, tx)); err != nil {
			_ = d.Rollback()
			return err
		}
		return d.CommitContext(ctx)
	}
}

func TestOutboxConformanceDeferred(t *testing.T) {
	b := postgresBackend(t)
	outboxtest.Run(t, func(t *testing.T) (outbox.Store, outboxtest.InTx) {
		s, db := b.newStore(t)
		return s.Outbox(), deferredTx(t, db, s.Outbox())
	}, outboxtest.IDsAtCommit())
}

// deferredSetup is a PostgreSQL store with a business table.
func deferredSetup(t *testing.T) (*gormstore.Store, *gorm.DB, string) {
	t.Helper()
	s, db := postgresBackend(t).newStore(t)
	business := s.TablePrefix() + "business"
	if err := db.Exec("CREATE TABLE " + business + " (id text PRIMARY KEY)").Error; err != nil {
		t.Fatal(err)
	}
	return s, db, business
}

// beginDeferred starts a producer transaction of Outbox.Begin (the
// deferred one: PostgreSQL with the Pipeline plugin).
func beginDeferred(t *testing.T, s *gormstore.Store, db *gorm.DB) *gorm.DB {
	t.Helper()
	tx, err := s.Outbox().Begin(context.Background(), db)
	if err != nil || gormstore.DeferredOf(tx) == nil {
		t.Fatalf("Begin = %v, %v; want a deferred transaction", tx, err)
	}
	return tx
}

func count(t *testing.T, db *gorm.DB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.Raw(q, args...).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func msg(id, typ string) *outbox.Message {
	return &outbox.Message{MessageID: id, Destination: "exchange:" + typ, MessageType: typ, Payload: []byte(`{}`)}
}

func TestDeferredAddWaitsForCommit(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	out := s.Outbox()
	tx, err := out.Begin(ctx, db)
	if err != nil || tx == nil {
		t.Fatalf("Begin: %v, %v", tx, err)
	}
	t.Cleanup(func() { _ = gormstore.DeferredOf(tx).Rollback() }) // a failed test must not leave it open: the tables are dropped
	d := gormstore.DeferredOf(tx)
	if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", "b1").Error; err != nil {
		t.Fatal(err)
	}
	msgs := []*outbox.Message{msg("d1", "T"), msg("d2", "T")}
	if err := out.Add(gormstore.WithTx(ctx, tx), msgs[:1]); err != nil {
		t.Fatal(err)
	}
	if err := out.Add(gormstore.WithTx(ctx, tx), msgs[1:]); err != nil {
		t.Fatal(err)
	}
	// Refused at Add, not at commit: what is wrong with a message.
	if err := out.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{{MessageID: "bad"}}); err == nil {
		t.Fatal("Add of a message without a destination: no error")
	}
	if d.Pending() != 2 {
		t.Fatalf("pending = %d, want 2", d.Pending())
	}
	// AfterCommit's function runs once the rows and the COMMIT are in:
	// it sees them from another connection.
	afterRows := int64(-1)
	d.AfterCommit(func() {
		afterRows = count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox WHERE message_id IN (?, ?)", "d1", "d2")
	})
	if n := count(t, tx, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 0 {
		t.Fatalf("%d outbox rows before the commit, want 0 (deferred)", n)
	}
	if err := d.CommitContext(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if afterRows != 2 {
		t.Errorf("AfterCommit's function saw %d outbox rows, want 2 (it must run after the commit, once)", afterRows)
	}
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox WHERE message_id IN (?, ?)", "d1", "d2"); n != 2 {
		t.Fatalf("%d outbox rows after the commit, want 2", n)
	}
	if n := count(t, db, "SELECT count(*) FROM "+business); n != 1 {
		t.Fatalf("%d business rows, want 1", n)
	}
	for _, m := range msgs {
		if m.ID == 0 || m.CreatedAt.IsZero() {
			t.Errorf("message %s: id %d, created %v not read back", m.MessageID, m.ID, m.CreatedAt)
		}
	}
	if err := d.Rollback(); !errors.Is(err, gormstore.ErrTxDone) {
		t.Errorf("Rollback after Commit = %v, want ErrTxDone", err)
	}
}

// A failing outbox insert at commit fails the commit: the business row is
// not committed without its outbox row, and the connection stays usable.
func TestDeferredInsertFailureRollsBack(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	out := s.Outbox()
	// Only the database can refuse this row: Add's checks pass.
	if err := db.Exec("ALTER TABLE " + s.TablePrefix() + "outbox ADD CONSTRAINT no_boom CHECK (message_type <> 'Boom')").Error; err != nil {
		t.Fatal(err)
	}
	for range 3 { // more than once: the connection goes back clean
		tx, err := out.Begin(ctx, db)
		if err != nil || tx == nil {
			t.Fatalf("Begin: %v, %v", tx, err)
		}
		t.Cleanup(func() { _ = gormstore.DeferredOf(tx).Rollback() }) // a failed test must not leave it open: the tables are dropped
		if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", "b1").Error; err != nil {
			t.Fatal(err)
		}
		if err := out.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("ok", "T"), msg("boom", "Boom")}); err != nil {
			t.Fatalf("Add: %v", err)
		}
		ran := false
		gormstore.DeferredOf(tx).AfterCommit(func() { ran = true })
		if err := gormstore.DeferredOf(tx).CommitContext(ctx); err == nil {
			t.Fatal("commit succeeded though the outbox insert failed")
		}
		if ran {
			t.Error("AfterCommit's function ran though the commit failed")
		}
		if n := count(t, db, "SELECT count(*) FROM "+business); n != 0 {
			t.Fatalf("%d business rows committed without their outbox rows", n)
		}
		if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 0 {
			t.Fatalf("%d outbox rows, want 0", n)
		}
	}
}

// After a SAVEPOINT messages are written at once, so that ROLLBACK TO
// takes them with the savepoint's other work.
func TestDeferredSavepoint(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	out := s.Outbox()
	tx, err := out.Begin(ctx, db)
	if err != nil || tx == nil {
		t.Fatalf("Begin: %v, %v", tx, err)
	}
	t.Cleanup(func() { _ = gormstore.DeferredOf(tx).Rollback() }) // a failed test must not leave it open: the tables are dropped
	add := func(tx *gorm.DB, id string) {
		t.Helper()
		if err := out.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg(id, "T")}); err != nil {
			t.Fatal(err)
		}
	}
	add(tx, "before")
	inner := errors.New("inner fails")
	err = tx.Transaction(func(tx2 *gorm.DB) error {
		if err := tx2.Exec("INSERT INTO "+business+" (id) VALUES (?)", "inner").Error; err != nil {
			return err
		}
		add(tx2, "inside")
		return inner
	})
	if !errors.Is(err, inner) {
		t.Fatalf("nested Transaction = %v", err)
	}
	add(tx, "after")
	if err := gormstore.DeferredOf(tx).CommitContext(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := db.Raw("SELECT message_id FROM " + s.TablePrefix() + "outbox ORDER BY id").Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != "before" || ids[1] != "after" {
		t.Fatalf("outbox rows %v, want [before after] (inside was rolled back to its savepoint)", ids)
	}
	if n := count(t, db, "SELECT count(*) FROM "+business); n != 0 {
		t.Fatalf("%d business rows, want 0", n)
	}
}

// A transaction that failed on the server (the caller ignored an error)
// does not report a commit.
func TestDeferredCommitOfFailedTransaction(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	for _, withMsg := range []bool{false, true} {
		tx := beginDeferred(t, s, db)
		t.Cleanup(func() { _ = gormstore.DeferredOf(tx).Rollback() })       // a failed test must not leave it open: the tables are dropped
		_ = tx.Exec("INSERT INTO " + business + " (nope) VALUES (1)").Error // fails: no such column
		if withMsg {
			if err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("m", "T")}); err != nil {
				t.Fatal(err)
			}
		}
		if err := gormstore.DeferredOf(tx).CommitContext(ctx); err == nil {
			t.Fatalf("with a message %v: commit of a failed transaction reported success", withMsg)
		}
	}
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 0 {
		t.Fatalf("%d outbox rows, want 0", n)
	}
}

func TestDeferredRollback(t *testing.T) {
	s, db, _ := deferredSetup(t)
	ctx := context.Background()
	tx := beginDeferred(t, s, db)
	t.Cleanup(func() { _ = gormstore.DeferredOf(tx).Rollback() }) // a failed test must not leave it open: the tables are dropped
	if err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("r", "T")}); err != nil {
		t.Fatal(err)
	}
	ran := false
	gormstore.DeferredOf(tx).AfterCommit(func() { ran = true })
	if err := gormstore.DeferredOf(tx).Rollback(); err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Error("AfterCommit's function ran on a rollback")
	}
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 0 {
		t.Fatalf("%d outbox rows after rollback, want 0", n)
	}
}

// Without the plugin (SQLite; a PostgreSQL database opened without it)
// Begin declines and Add writes at once, as before.
func TestDeferredNeedsPlugin(t *testing.T) {
	s, db := sqliteBackend().newStore(t)
	tx, err := s.Outbox().Begin(context.Background(), db)
	if err != nil || tx != nil {
		t.Fatalf("Begin on SQLite = %v, %v; want nil, nil", tx, err)
	}
}

// When writing the kept rows before a SAVEPOINT fails, the transaction
// does not commit: its rows are not in it. (A canceled context, as here,
// also costs the connection; the transaction refuses the commit on its
// own as well, for a failure that leaves the connection usable.)
func TestDeferredFlushFailureDoesNotCommit(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	out := s.Outbox()
	tx, err := out.Begin(ctx, db)
	if err != nil || tx == nil {
		t.Fatalf("Begin: %v, %v", tx, err)
	}
	t.Cleanup(func() { _ = gormstore.DeferredOf(tx).Rollback() }) // a failed test must not leave it open: the tables are dropped
	if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", "b1").Error; err != nil {
		t.Fatal(err)
	}
	if err := out.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("kept", "T")}); err != nil {
		t.Fatal(err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := tx.WithContext(canceled).Exec("SAVEPOINT a").Error; err == nil {
		t.Fatal("SAVEPOINT with a canceled context: no error")
	}
	if err := gormstore.DeferredOf(tx).CommitContext(ctx); err == nil {
		t.Fatal("commit succeeded though the kept outbox row was never written")
	}
	if n := count(t, db, "SELECT count(*) FROM "+business); n != 0 {
		t.Fatalf("%d business rows committed without their outbox row", n)
	}
	// The pool still works.
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 0 {
		t.Fatalf("%d outbox rows, want 0", n)
	}
}

// Cancel in the transaction that published the message finds it: the
// kept rows are written first.
func TestDeferredCancelSeesKeptRows(t *testing.T) {
	s, db, _ := deferredSetup(t)
	ctx := context.Background()
	out := s.Outbox()
	tx, err := out.Begin(ctx, db)
	if err != nil || tx == nil {
		t.Fatalf("Begin: %v, %v", tx, err)
	}
	t.Cleanup(func() { _ = gormstore.DeferredOf(tx).Rollback() }) // a failed test must not leave it open: the tables are dropped
	m := msg("sched", "T")
	m.Delay = time.Hour
	if err := out.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{m, msg("other", "T")}); err != nil {
		t.Fatal(err)
	}
	n, err := out.Cancel(gormstore.WithTx(ctx, tx), "sched")
	if err != nil || n != 1 {
		t.Fatalf("Cancel in the publishing transaction = %d, %v; want 1", n, err)
	}
	if err := out.Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("later", "T")}); err != nil {
		t.Fatal(err)
	}
	if err := gormstore.DeferredOf(tx).CommitContext(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := db.Raw("SELECT message_id FROM " + s.TablePrefix() + "outbox ORDER BY id").Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != "other" || ids[1] != "later" {
		t.Fatalf("outbox rows %v, want [other later]", ids)
	}
}
