package gormstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
)

// TestDeferredBeginRoundTrips counts what a producer transaction of
// Outbox.Begin sends: its BEGIN rides on its first Exec, and its outbox
// rows on its COMMIT. A transaction whose first statement reads sends the
// BEGIN on its own first.
func TestDeferredBeginRoundTrips(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(tx *gorm.DB, business, id string) error
		rows int64 // business rows each run commits
		want int64
	}{
		{"exec first", func(tx *gorm.DB, business, id string) error {
			return tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", id).Error
		}, 1, 2},
		{"exec first without arguments", func(tx *gorm.DB, business, id string) error {
			// pgx sends an argument-less statement with the simple
			// protocol, which takes several statements in one string.
			return tx.Exec("INSERT INTO " + business + " (id) VALUES ('" + id + "'); INSERT INTO " + business + " (id) VALUES ('" + id + "-2')").Error
		}, 2, 2},
		{"query first", func(tx *gorm.DB, business, id string) error {
			var n int64
			if err := tx.Raw("SELECT count(*) FROM " + business).Scan(&n).Error; err != nil {
				return err
			}
			return tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", id).Error
		}, 1, 4},
		{"publish only", func(tx *gorm.DB, business, id string) error { return nil }, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, db, w, business := countedStore(t, true)
			ctx := context.Background()
			for i, id := range []string{"warm-1", "warm-2", "m"} { // pgx prepares a statement on its first use
				before := w.n.Load()
				tx := beginDeferred(t, s, db)
				if err := c.run(tx, business, id); err != nil {
					t.Fatal(err)
				}
				if err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("out-"+id, "Out")}); err != nil {
					t.Fatal(err)
				}
				if err := gormstore.DeferredOf(tx).CommitContext(ctx); err != nil {
					t.Fatal(err)
				}
				if got := w.n.Load() - before; i == 2 && got != c.want {
					t.Errorf("%d round trips, want %d", got, c.want)
				}
			}
			if n := count(t, db, "SELECT count(*) FROM "+business); n != 3*c.rows {
				t.Errorf("%d business rows, want %d", n, 3*c.rows)
			}
			if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 3 {
				t.Errorf("%d outbox rows, want 3", n)
			}
		})
	}
}

// A transaction that runs nothing sends nothing, commit or rollback.
func TestDeferredEmptyTransactionSendsNothing(t *testing.T) {
	s, db, w, _ := countedStore(t, true)
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		before := w.n.Load()
		tx := beginDeferred(t, s, db)
		d := gormstore.DeferredOf(tx)
		ran := false
		d.AfterCommit(func() { ran = true })
		endDeferred(t, ctx, d, commit)
		if got := w.n.Load() - before; got != 0 {
			t.Errorf("commit=%v: %d round trips, want 0", commit, got)
		}
		if ran != commit {
			t.Errorf("commit=%v: AfterCommit's function ran = %v", commit, ran)
		}
	}
}

// A rollback after the first Exec (which carried the BEGIN) undoes it.
func TestDeferredRollbackAfterFirstExec(t *testing.T) {
	s, db, business := deferredSetup(t)
	tx := beginDeferred(t, s, db)
	if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", "a").Error; err != nil {
		t.Fatal(err)
	}
	if err := gormstore.DeferredOf(tx).Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, "SELECT count(*) FROM "+business); n != 0 {
		t.Fatalf("%d business rows after rollback, want 0", n)
	}
}

// A statement prepared first (GORM's PrepareStmt, database/sql's Prepare)
// runs inside the transaction: the pending BEGIN goes before the prepare,
// so a rollback undoes what the prepared statement did, and a commit keeps
// it with the transaction's outbox rows.
func TestDeferredPrepareFirst(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	for _, commit := range []bool{false, true} {
		tx := beginDeferred(t, s, db)
		d := gormstore.DeferredOf(tx)
		stmt, err := d.PrepareContext(ctx, "INSERT INTO "+business+" (id) VALUES ($1)")
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("prepared-%v", commit)
		if _, err := stmt.ExecContext(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("out-"+id, "Out")}); err != nil {
			t.Fatal(err)
		}
		endDeferred(t, ctx, d, commit)
		_ = stmt.Close()
		want := int64(0)
		if commit {
			want = 1
		}
		if n := count(t, db, "SELECT count(*) FROM "+business+" WHERE id = ?", id); n != want {
			t.Errorf("commit %v: %d business rows, want %d", commit, n, want)
		}
		if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox WHERE message_id = ?", "out-"+id); n != want {
			t.Errorf("commit %v: %d outbox rows, want %d", commit, n, want)
		}
	}
}

// When the first Exec fails (it carried the BEGIN), nothing after it runs
// and nothing commits; the connection goes back clean.
func TestDeferredFirstExecFails(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	if err := db.Exec("INSERT INTO "+business+" (id) VALUES (?)", "taken").Error; err != nil {
		t.Fatal(err)
	}
	tx := beginDeferred(t, s, db)
	if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", "taken").Error; err == nil {
		t.Fatal("duplicate key: no error")
	}
	if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", "after").Error; err == nil {
		t.Error("a statement after the failed first one ran")
	}
	if err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("m", "T")}); err != nil {
		t.Fatal(err)
	}
	if err := gormstore.DeferredOf(tx).CommitContext(ctx); err == nil {
		t.Fatal("commit of a failed transaction succeeded")
	}
	if n := count(t, db, "SELECT count(*) FROM "+business); n != 1 {
		t.Errorf("%d business rows, want 1 (the one from before)", n)
	}
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 0 {
		t.Errorf("%d outbox rows, want 0", n)
	}
	// The pool is usable: a new transaction commits.
	tx = beginDeferred(t, s, db)
	if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", "next").Error; err != nil {
		t.Fatal(err)
	}
	if err := gormstore.DeferredOf(tx).CommitContext(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, "SELECT count(*) FROM "+business+" WHERE id = 'next'"); n != 1 {
		t.Errorf("%d rows of the next transaction, want 1", n)
	}
}

// The BEGIN never reached the server (the first statement's context was
// done): a later statement must fail, not run on its own outside a
// transaction and commit by itself. Through Exec, Query and QueryRow.
func TestDeferredBeginNotSentLaterStatementsFail(t *testing.T) {
	s, db, business := deferredSetup(t)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()
	for name, first := range map[string]func(tx *gorm.DB) error{
		"exec": func(tx *gorm.DB) error {
			return tx.WithContext(done).Exec("INSERT INTO "+business+" (id) VALUES (?)", "first-exec").Error
		},
		"query": func(tx *gorm.DB) error {
			var ids []string
			return tx.WithContext(done).Raw("SELECT id FROM " + business).Scan(&ids).Error
		},
		"query row": func(tx *gorm.DB) error {
			var n int64
			return tx.WithContext(done).Raw("SELECT count(*) FROM " + business).Row().Scan(&n)
		},
	} {
		t.Run(name, func(t *testing.T) {
			tx := beginDeferred(t, s, db)
			if err := first(tx); err == nil {
				t.Fatal("a statement on a done context succeeded")
			}
			if err := tx.WithContext(ctx).Exec("INSERT INTO "+business+" (id) VALUES (?)", name).Error; err == nil {
				t.Error("a later Exec ran")
			}
			var n int64
			if err := tx.WithContext(ctx).Raw("SELECT count(*) FROM " + business).Row().Scan(&n); err == nil {
				t.Error("a later QueryRow ran")
			}
			if err := gormstore.DeferredOf(tx).CommitContext(ctx); err == nil {
				t.Error("the commit succeeded")
			}
			if n := count(t, db, "SELECT count(*) FROM "+business); n != 0 {
				t.Errorf("%d business rows, want 0", n)
			}
		})
	}
}

// Named arguments reach pgx as database/sql would hand them over.
func TestDeferredFirstExecNamedArgument(t *testing.T) {
	s, db, business := deferredSetup(t)
	ctx := context.Background()
	tx := beginDeferred(t, s, db)
	res := tx.Exec("INSERT INTO "+business+" (id) VALUES (@id)", sql.Named("id", "named"))
	if res.Error != nil {
		t.Fatal(res.Error)
	}
	if res.RowsAffected != 1 {
		t.Errorf("RowsAffected = %d, want 1", res.RowsAffected)
	}
	if err := gormstore.DeferredOf(tx).CommitContext(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, "SELECT count(*) FROM "+business+" WHERE id = 'named'"); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

// endDeferred commits d, or rolls it back, and fails the test on an error.
func endDeferred(t *testing.T, ctx context.Context, d *gormstore.DeferredTx, commit bool) {
	t.Helper()
	var err error
	if commit {
		err = d.CommitContext(ctx)
	} else {
		err = d.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
}
