package gormstore_test

import (
	"context"
	"os"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/outbox/outboxtest"
)

// TestOutboxConformancePlainPostgres runs the outbox suite on a *gorm.DB
// opened without postgresdb.Open, so without the pipeline plugin: the held
// batches of ClaimBatch send their BEGIN, claim, outcome and COMMIT one
// statement at a time there.
func TestOutboxConformancePlainPostgres(t *testing.T) {
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		t.Skipf("PostgreSQL tests skipped: set %s", postgresDSNEnv)
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(t, db) })
	outboxtest.Run(t, func(t *testing.T) (outbox.Store, outboxtest.InTx) {
		prefix := randomPrefix(t)
		s := migrated(t, db, gormstore.WithTablePrefix(prefix))
		t.Cleanup(func() { dropTables(t, db, s.TablePrefix()) })
		if _, ok := db.Config.Plugins[gormstore.PipelinePlugin]; ok {
			t.Fatal("the plain *gorm.DB has the pipeline plugin")
		}
		return s.Outbox(), inTx(db)
	})
}

// TestClaimBatchInATransactionIsLeased: a store made on a transaction has
// no pool to hold a batch's own transaction on, so ClaimBatch leases it.
func TestClaimBatchInATransactionIsLeased(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	ctx := context.Background()
	if err := inTx(db)(ctx, func(ctx context.Context) error {
		return s.Outbox().Add(ctx, []*outbox.Message{{MessageID: "m", Destination: "queue:q"}})
	}); err != nil {
		t.Fatal(err)
	}
	err := db.Transaction(func(tx *gorm.DB) error {
		ts, err := gormstore.New(tx, gormstore.WithTablePrefix(s.TablePrefix()))
		if err != nil {
			return err
		}
		batch, err := ts.Outbox().ClaimBatch(ctx, "relay-tx", 10, time.Minute)
		if err != nil {
			return err
		}
		if len(batch.Messages()) != 1 {
			t.Fatalf("ClaimBatch in a transaction claimed %d rows, want 1", len(batch.Messages()))
		}
		var lockedBy *string
		if err := tx.Raw(`SELECT locked_by FROM ` + s.TablePrefix() + `outbox`).Scan(&lockedBy).Error; err != nil {
			return err
		}
		if lockedBy == nil || *lockedBy != "relay-tx" {
			t.Fatalf("locked_by = %v, want the lease's owner relay-tx", lockedBy)
		}
		return batch.Settle(ctx, outbox.Settlement{Delivered: []int64{batch.Messages()[0].ID}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := deliveredRows(t, s.Outbox()); n != 1 {
		t.Fatalf("%d rows delivered, want 1", n)
	}
}

// TestHeldBatchFreedWhenItsConnectionDies: a relay that dies (its
// connection gone) frees its held rows at once, long before the hold (a
// minute here) would have run out; its settlement, should it come, fails
// and records nothing.
func TestHeldBatchFreedWhenItsConnectionDies(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	ctx := context.Background()
	if err := inTx(db)(ctx, func(ctx context.Context) error {
		return s.Outbox().Add(ctx, []*outbox.Message{{MessageID: "d-0", Destination: "queue:q"}, {MessageID: "d-1", Destination: "queue:q"}})
	}); err != nil {
		t.Fatal(err)
	}
	batch, err := s.Outbox().ClaimBatch(ctx, "relay-dead", 10, time.Minute)
	if err != nil || len(batch.Messages()) != 2 {
		t.Fatalf("ClaimBatch = %v, %v; want 2 rows", batch, err)
	}
	var killed int
	if err := db.Raw(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'idle in transaction'
  AND position('SKIP LOCKED' in query) > 0 AND position(? in query) > 0`, s.TablePrefix()+"outbox").Scan(&killed).Error; err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d held-batch sessions, want 1", killed)
	}
	start := time.Now()
	for {
		got, err := s.Outbox().Claim(ctx, "relay-alive", 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 2 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("5s after the holder's connection died another relay claims %d rows, want 2", len(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := batch.Settle(ctx, outbox.Settlement{Delivered: []int64{batch.Messages()[0].ID}}); err == nil {
		t.Fatal("the dead holder's settlement succeeded")
	}
	if st, err := s.Outbox().Stats(ctx); err != nil || deliveredRows(t, s.Outbox()) != 0 || st.Pending != 2 {
		t.Fatalf("Stats = %+v, %v; want 2 pending, none delivered", st, err)
	}
}

// TestClaimSetsHoldWithoutRows: the claim statement sets its transaction's
// idle timeout (the batch's hold) even when it claims nothing, so that a
// relay frozen between an empty claim and its ROLLBACK is ended after the
// hold too.
func TestClaimSetsHoldWithoutRows(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	ctx := context.Background()
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	c, err := sqlDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = c.ExecContext(ctx, "ROLLBACK") }()
	rows, err := c.QueryContext(ctx, s.Outbox().ClaimHeldSQL(), "1234", 10)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if n != 0 {
		t.Fatalf("the claim on an empty outbox returned %d rows", n)
	}
	var got string
	if err := c.QueryRowContext(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "1234ms" {
		t.Fatalf("idle_in_transaction_session_timeout after an empty claim = %q, want 1234ms", got)
	}
}

// deliveredRows counts s's delivered rows (Stats does not).
func deliveredRows(t testing.TB, s outbox.Store) int64 {
	t.Helper()
	return outboxtest.Delivered(t, context.Background(), s)
}
