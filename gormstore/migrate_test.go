package gormstore_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
)

// sqlRecorder is a GORM logger that keeps every statement run through it.
type sqlRecorder struct {
	logger.Interface
	mu    sync.Mutex
	stmts []string
}

func newSQLRecorder() *sqlRecorder {
	return &sqlRecorder{Interface: logger.Default.LogMode(logger.Silent)}
}

func (r *sqlRecorder) LogMode(logger.LogLevel) logger.Interface { return r }

func (r *sqlRecorder) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	r.mu.Lock()
	r.stmts = append(r.stmts, sql)
	r.mu.Unlock()
}

var ddlPattern = regexp.MustCompile(`(?is)^\s*(CREATE|ALTER|DROP)\b`)

func (r *sqlRecorder) ddl() (ddl []string, all int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.stmts {
		if ddlPattern.MatchString(s) {
			ddl = append(ddl, s)
		}
	}
	return ddl, len(r.stmts)
}

// TestMigrateUpToDateRunsNoDDL: on a schema that is already there, Migrate
// only reads the catalog.
func TestMigrateUpToDateRunsNoDDL(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, db := b.newStore(t) // migrated
		rec := newSQLRecorder()
		again, err := gormstore.New(db.Session(&gorm.Session{Logger: rec}), gormstore.WithTablePrefix(s.TablePrefix()))
		if err != nil {
			t.Fatal(err)
		}
		if err := again.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		ddl, all := rec.ddl()
		if all == 0 {
			t.Fatal("the recorder saw no statement at all")
		}
		if len(ddl) > 0 {
			t.Fatalf("Migrate on an up-to-date schema ran DDL: %q", ddl)
		}

		// A missing index is noticed and created (and the recorder does see
		// DDL).
		if err := db.Exec("DROP INDEX " + s.TablePrefix() + "outbox_parked_idx").Error; err != nil {
			t.Fatal(err)
		}
		if err := again.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		if ddl, _ := rec.ddl(); len(ddl) == 0 {
			t.Fatal("Migrate did not recreate a dropped index")
		}
		var n int64
		q := "SELECT count(*) FROM pg_indexes WHERE indexname = ?"
		if b.name == "sqlite" {
			q = "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?"
		}
		if err := db.Raw(q, s.TablePrefix()+"outbox_parked_idx").Scan(&n).Error; err != nil || n != 1 {
			t.Fatalf("the dropped index is back: %d, %v", n, err)
		}
	})
}

// TestMigrateWithLiveTraffic: instances restarting (Migrate) while others
// run inbox and outbox transactions on the same tables. The handler shape
// of Process (outbox row, then the inbox mark) takes the tables in the
// opposite order from the script, which used to end in "deadlock detected".
func TestMigrateWithLiveTraffic(t *testing.T) {
	db := postgresBackend(t).db
	prefix := randomPrefix(t)
	t.Cleanup(func() { dropTables(t, db, prefix) })
	s := migrated(t, db, gormstore.WithTablePrefix(prefix))
	defer s.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seq, handled atomic.Int64
	var trafficErr atomic.Value
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for ctx.Err() == nil {
				key := inbox.Key{MessageID: fmt.Sprintf("m-%d", seq.Add(1)), ConsumerType: "c"}
				handler := func(ctx context.Context) error {
					if err := s.Outbox().Add(ctx, []*outbox.Message{{MessageID: key.MessageID, Destination: "queue:q"}}); err != nil {
						return err
					}
					time.Sleep(2 * time.Millisecond) // the handler's own work, holding its locks
					return nil
				}
				var err error
				if w%2 == 0 {
					// Two-phase: lock, then outbox row and inbox mark in one transaction.
					var l inbox.Lock
					if l, err = s.Inbox().TryLock(ctx, key, time.Minute); err == nil {
						err = s.Inbox().Process(ctx, key, l.Token, handler)
					}
				} else {
					_, err = s.Inbox().ProcessAndLock(ctx, key, handler)
				}
				if err != nil && ctx.Err() == nil {
					trafficErr.CompareAndSwap(nil, err)
					return
				}
				handled.Add(1)
			}
		})
	}
	// Let the traffic get going before the restarts begin.
	waitFor(t, "traffic", func() bool { return handled.Load() >= 20 })
	var migrateErr error
	// At least 15 restarts, and for as long as 100 more messages take.
	until := handled.Load() + 100
	for i := 0; i < 15 || handled.Load() < until; i++ {
		other, err := gormstore.New(db, gormstore.WithTablePrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Migrate(ctx); err != nil {
			migrateErr = fmt.Errorf("Migrate %d: %w", i, err)
			break
		}
	}
	cancel()
	wg.Wait()
	if migrateErr != nil {
		t.Fatal(migrateErr)
	}
	if err, _ := trafficErr.Load().(error); err != nil {
		t.Fatalf("traffic failed while Migrate ran: %v", err)
	}
	t.Logf("%d messages handled while Migrate ran", handled.Load())
}

// TestMigrateRetriesDeadlock: a migration that has DDL to run and meets a
// transaction taking the tables in the opposite order is chosen as the
// deadlock victim, and tries again.
//
// PostgreSQL checks a waiting session for a deadlock once, deadlock_timeout
// after it began to wait; the first check that finds the cycle aborts its
// own session. So that the migration is the victim however slowly this
// test gets the other transaction to wait (a loaded CI machine took over
// the default 1 s), the migration's sessions check after 5 s and the
// transaction's after 60 s.
func TestMigrateRetriesDeadlock(t *testing.T) {
	db := postgresBackend(t).db
	migrationDB, err := postgresdb.Open(os.Getenv(postgresDSNEnv) + " deadlock_timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(t, migrationDB) })
	prefix := randomPrefix(t)
	t.Cleanup(func() { dropTables(t, db, prefix) })
	s := migrated(t, db, gormstore.WithTablePrefix(prefix))
	defer s.Close()
	ctx := context.Background()
	// A missing index: Migrate has to run the script.
	if err := db.Exec("DROP INDEX " + prefix + "outbox_parked_idx").Error; err != nil {
		t.Fatal(err)
	}

	// A transaction holds the outbox (a row written) ...
	added := make(chan error, 1)
	proceed := make(chan struct{})
	txDone := make(chan error, 1)
	go func() {
		txDone <- db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("SET LOCAL deadlock_timeout = '60s'").Error; err != nil {
				added <- err
				return err
			}
			err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{{MessageID: "holds-outbox", Destination: "queue:q"}})
			added <- err
			if err != nil {
				return err
			}
			<-proceed
			// ... then needs the inbox, as a handler's inbox mark does.
			return tx.Exec("INSERT INTO "+prefix+"inbox (message_id, consumer_type, expires_at) VALUES (?, ?, now())", "x", "c").Error
		})
	}()
	if err := <-added; err != nil {
		close(proceed)
		t.Fatal(err)
	}
	rec := newSQLRecorder()
	m, err := gormstore.New(migrationDB.Session(&gorm.Session{Logger: rec}), gormstore.WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	migrateDone := make(chan error, 1)
	go func() { migrateDone <- m.Migrate(ctx) }()
	// The migration, which has locked the inbox for its indexes, waits for
	// that transaction on the outbox ...
	waitFor(t, "Migrate to wait for the outbox", func() bool {
		var n int64
		err := db.Raw("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass(?)", prefix+"outbox").Scan(&n).Error
		return err == nil && n > 0
	})
	// ... and the transaction now waits for the migration on the inbox: a
	// deadlock, which PostgreSQL breaks by aborting the migration (its
	// deadlock check runs first: see above).
	close(proceed)
	if err := <-txDone; err != nil {
		t.Fatalf("the transaction that meets the migration: %v", err)
	}
	if err := <-migrateDone; err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	var attempts int
	rec.mu.Lock()
	for _, stmt := range rec.stmts {
		if strings.Contains(stmt, "pg_advisory_xact_lock") {
			attempts++
		}
	}
	rec.mu.Unlock()
	if attempts < 2 {
		t.Fatalf("Migrate took the migration lock %d times; want a retry after the deadlock", attempts)
	}
}

// TestMigrateWaitsForAnotherMigratorWithABound: a migrator of the same
// prefix that holds its turn (a process frozen mid-migration keeps its
// transaction and the advisory lock) fails Migrate after the turn timeout
// with an error that says so, instead of hanging a Start whose context
// has no deadline; once the turn is free Migrate succeeds.
func TestMigrateWaitsForAnotherMigratorWithABound(t *testing.T) {
	db := postgresBackend(t).db
	prefix := randomPrefix(t)
	t.Cleanup(func() { dropTables(t, db, prefix) })
	defer gormstore.SetMigrateTurnTimeout("1s")()
	s, err := gormstore.New(db, gormstore.WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	release := testenv.HoldInTransaction(t, db, func(tx *gorm.DB) error { return gormstore.HoldMigrateTurn(tx, prefix) })
	// A deadline far beyond the turn timeout: without the bound, Migrate
	// would wait for it and fail with it.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	err = s.Migrate(ctx)
	took := time.Since(start)
	releaseErr := release()
	if err == nil {
		t.Fatal("Migrate succeeded while another migrator held the turn")
	}
	if !strings.Contains(err.Error(), "held the migration lock of table prefix") {
		t.Errorf("the error does not say another migrator holds the turn: %v", err)
	}
	if took > 10*time.Second {
		t.Errorf("Migrate took %v with a turn timeout of 1s", took)
	}
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate once the turn is free: %v", err)
	}
}
