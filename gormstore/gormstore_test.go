package gormstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/inbox/inboxtest"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/outbox/outboxtest"
)

// postgresDSNEnv names the variable that enables the PostgreSQL tests.
const postgresDSNEnv = "BAREWIRE_TEST_POSTGRES_DSN"

func TestMain(m *testing.M) {
	// Every database opened by a test is closed by its cleanup, so no pool,
	// driver or listener goroutine may survive the run.
	// GORM's prepared-statement cache starts a goroutine that never ends
	// (gorm.io/gorm/internal/lru: "done channel is never closed").
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"))
}

// backend opens empty stores on one database.
type backend struct {
	name string
	// db is the shared pool of the PostgreSQL backend (nil for SQLite,
	// where every store has its own database).
	db *gorm.DB
	// newStore returns a migrated, empty store and its database.
	newStore func(t *testing.T, opts ...gormstore.Option) (*gormstore.Store, *gorm.DB)
}

func sqliteBackend() backend {
	return backend{name: "sqlite", newStore: func(t *testing.T, opts ...gormstore.Option) (*gormstore.Store, *gorm.DB) {
		t.Helper()
		db, err := gormstore.OpenSQLite("") // a fresh in-memory database
		if err != nil {
			t.Fatalf("OpenSQLite: %v", err)
		}
		t.Cleanup(func() { closeDB(t, db) })
		return migrated(t, db, opts...), db
	}}
}

// postgresBackend shares one connection pool among the stores of a test
// (closed when the test ends) and isolates stores by a random table prefix,
// dropping their tables afterwards. It skips the test without the DSN.
func postgresBackend(t *testing.T) backend {
	t.Helper()
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		t.Skipf("PostgreSQL tests skipped: set %s (e.g. %q)", postgresDSNEnv, "host=127.0.0.1 user=postgres dbname=test sslmode=disable")
	}
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatalf("postgresdb.Open: %v", err)
	}
	t.Cleanup(func() { closeDB(t, db) })
	return backend{name: "postgres", db: db, newStore: func(t *testing.T, opts ...gormstore.Option) (*gormstore.Store, *gorm.DB) {
		t.Helper()
		prefix := randomPrefix(t)
		s := migrated(t, db, append([]gormstore.Option{gormstore.WithTablePrefix(prefix)}, opts...)...)
		t.Cleanup(func() { dropTables(t, db, s.TablePrefix()) })
		return s, db
	}}
}

// backends runs fn once per available database.
func backends(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, sqliteBackend()) })
	t.Run("postgres", func(t *testing.T) { fn(t, postgresBackend(t)) })
}

func migrated(t *testing.T, db *gorm.DB, opts ...gormstore.Option) *gormstore.Store {
	t.Helper()
	s, err := gormstore.New(db, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func randomPrefix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "bw_" + hex.EncodeToString(b) + "_"
}

func dropTables(t *testing.T, db *gorm.DB, prefix string) {
	t.Helper()
	err := db.Exec("DROP TABLE IF EXISTS " + prefix + "inbox, " + prefix + "outbox, " + prefix + "business").Error
	if err != nil {
		t.Errorf("drop tables %s*: %v", prefix, err)
	}
}

func closeDB(t *testing.T, db *gorm.DB) {
	t.Helper()
	if err := gormstore.Close(db); err != nil {
		t.Errorf("close database: %v", err)
	}
}

// inTx is the transaction runner the outbox suite needs: the transaction
// goes into ctx the way Outbox.Add looks for it.
func inTx(db *gorm.DB) outboxtest.InTx {
	return func(ctx context.Context, fn func(ctx context.Context) error) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return fn(gormstore.WithTx(ctx, tx))
		})
	}
}

func TestInboxConformance(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		inboxtest.Run(t, func(t *testing.T) inbox.Store {
			s, _ := b.newStore(t)
			return s.Inbox()
		})
	})
}

func TestOutboxConformance(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		var opts []outboxtest.Option
		if b.name == "sqlite" {
			// OpenSQLite allows one connection: one transaction at a time.
			opts = append(opts, outboxtest.SerialTransactions())
		}
		outboxtest.Run(t, func(t *testing.T) (outbox.Store, outboxtest.InTx) {
			s, db := b.newStore(t)
			return s.Outbox(), inTx(db)
		}, opts...)
	})
}

func TestMigrateIsIdempotent(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, db := b.newStore(t) // migrated once
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("second Migrate: %v", err)
		}
		// The tables work after the second run, and it kept their rows.
		if _, err := s.Inbox().TryLock(ctx, inbox.Key{MessageID: "m", ConsumerType: "c"}, time.Minute); err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("third Migrate: %v", err)
		}
		if st, err := s.Inbox().Stats(ctx); err != nil || st.Locked != 1 {
			t.Fatalf("Stats after re-migrating = %+v, %v; want the locked row kept", st, err)
		}
		if err := inTx(db)(ctx, func(ctx context.Context) error {
			return s.Outbox().Add(ctx, []*outbox.Message{{MessageID: "m", Destination: "queue:q"}})
		}); err != nil {
			t.Fatalf("Add: %v", err)
		}
	})
}

func TestMigrateConcurrently(t *testing.T) {
	db := postgresBackend(t).db
	// Several stores with one fresh prefix, migrating at the same moment, as
	// processes starting together would.
	prefix := randomPrefix(t)
	t.Cleanup(func() { dropTables(t, db, prefix) })
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make([]error, 4)
		start := make(chan struct{})
		for i := range errs {
			wg.Go(func() {
				st, err := gormstore.New(db, gormstore.WithTablePrefix(prefix))
				if err != nil {
					errs[i] = err
					return
				}
				<-start
				errs[i] = st.Migrate(context.Background())
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: concurrent Migrate: %v", round, err)
		}
	}
}

func TestInvalidPrefix(t *testing.T) {
	db, err := gormstore.OpenSQLite("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(t, db) })
	for _, prefix := range []string{
		"bad-prefix_", "1bw_", "bw prefix", "bw_;DROP TABLE x;--", "bw\"_", "sqlite_",
		strings.Repeat("p", 44),
	} {
		if _, err := gormstore.New(db, gormstore.WithTablePrefix(prefix)); err == nil || !strings.Contains(err.Error(), "invalid table prefix") {
			t.Errorf("New(WithTablePrefix(%q)) = %v, want an invalid prefix error", prefix, err)
		}
		if _, err := gormstore.MigrationSQL("postgres", prefix); err == nil {
			t.Errorf("MigrationSQL(postgres, %q) succeeded", prefix)
		}
	}
	for _, prefix := range []string{"", "x", "Bw_", "_", strings.Repeat("p", 43)} {
		if _, err := gormstore.New(db, gormstore.WithTablePrefix(prefix)); err != nil {
			t.Errorf("New(WithTablePrefix(%q)): %v", prefix, err)
		}
	}
	s, err := gormstore.New(db)
	if err != nil {
		t.Fatal(err)
	}
	if s.TablePrefix() != "barewire_" || s.Dialect() != "sqlite" {
		t.Errorf("defaults: prefix %q, dialect %q", s.TablePrefix(), s.Dialect())
	}
}

// otherDialector is a dialect gormstore does not support; New only asks for
// its name.
type otherDialector struct{ gorm.Dialector }

func (otherDialector) Name() string { return "mysql" }

func TestUnsupportedDialect(t *testing.T) {
	db := &gorm.DB{Config: &gorm.Config{Dialector: otherDialector{}}}
	_, err := gormstore.New(db)
	if err == nil || !strings.Contains(err.Error(), `"mysql"`) || !strings.Contains(err.Error(), `"postgres"`) || !strings.Contains(err.Error(), `"sqlite"`) {
		t.Fatalf("New on mysql = %v, want an error naming it and the supported dialects", err)
	}
	if _, err := gormstore.New(nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := gormstore.MigrationSQL("mysql", "x_"); err == nil {
		t.Fatal("MigrationSQL(mysql) succeeded")
	}
}

func TestMigrationSQL(t *testing.T) {
	for _, dialect := range []string{"postgres", "sqlite"} {
		def, err := gormstore.MigrationSQL(dialect, gormstore.DefaultTablePrefix)
		if err != nil {
			t.Fatalf("MigrationSQL(%s): %v", dialect, err)
		}
		for _, want := range []string{"CREATE TABLE IF NOT EXISTS barewire_inbox", "CREATE TABLE IF NOT EXISTS barewire_outbox", "WHERE status = 'pending'"} {
			if !strings.Contains(def, want) {
				t.Errorf("MigrationSQL(%s) lacks %q", dialect, want)
			}
		}
		custom, err := gormstore.MigrationSQL(dialect, "acme_")
		if err != nil {
			t.Fatalf("MigrationSQL(%s, acme_): %v", dialect, err)
		}
		if strings.Contains(custom, "barewire_") || !strings.Contains(custom, "acme_outbox_due_idx") {
			t.Errorf("MigrationSQL(%s, acme_) did not substitute the prefix:\n%s", dialect, custom)
		}
	}
}

// TestProcessSharesTransaction checks the point of the whole design: the
// handler's business writes and the messages it publishes commit with the
// inbox mark, and vanish with it when the lock was lost or the handler
// failed.
func TestProcessSharesTransaction(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, db := b.newStore(t)
		business := s.TablePrefix() + "business"
		if err := db.Exec("CREATE TABLE " + business + " (id text PRIMARY KEY)").Error; err != nil {
			t.Fatal(err)
		}
		in, out := s.Inbox(), s.Outbox()
		handler := func(id string, fail error) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				tx, ok := gormstore.TxFromContext(ctx)
				if !ok {
					return errors.New("no transaction in the handler's context")
				}
				if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", id).Error; err != nil {
					return err
				}
				if err := out.Add(ctx, []*outbox.Message{{MessageID: "out-" + id, Destination: "exchange:x"}}); err != nil {
					return err
				}
				return fail
			}
		}
		count := func(id string) (rows int64, msgs int) {
			t.Helper()
			if err := db.Raw("SELECT COUNT(*) FROM "+business+" WHERE id = ?", id).Scan(&rows).Error; err != nil {
				t.Fatal(err)
			}
			all, err := out.List(ctx, outbox.Query{})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range all {
				if m.MessageID == "out-"+id {
					msgs++
				}
			}
			return rows, msgs
		}

		// Success: everything commits.
		k := inbox.Key{MessageID: "ok", ConsumerType: "c"}
		l, err := in.TryLock(ctx, k, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Process(ctx, k, l.Token, handler("ok", nil)); err != nil {
			t.Fatalf("Process: %v", err)
		}
		if rows, msgs := count("ok"); rows != 1 || msgs != 1 {
			t.Fatalf("after Process: %d business rows, %d outbox rows; want 1, 1", rows, msgs)
		}

		// Handler failure: nothing commits.
		k = inbox.Key{MessageID: "fail", ConsumerType: "c"}
		if l, err = in.TryLock(ctx, k, time.Minute); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		if err := in.Process(ctx, k, l.Token, handler("fail", boom)); !errors.Is(err, boom) {
			t.Fatalf("Process with a failing handler = %v", err)
		}
		if rows, msgs := count("fail"); rows != 0 || msgs != 0 {
			t.Fatalf("after a failed handler: %d business rows, %d outbox rows; want none", rows, msgs)
		}

		// Lock lost: the stale holder's writes are rolled back.
		k = inbox.Key{MessageID: "stale", ConsumerType: "c"}
		stale, err := in.TryLock(ctx, k, 150*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		var fresh inbox.Lock
		for deadline := time.Now().Add(5 * time.Second); fresh.State != inbox.Acquired; time.Sleep(20 * time.Millisecond) {
			if fresh, err = in.TryLock(ctx, k, time.Minute); err != nil || time.Now().After(deadline) {
				t.Fatalf("take over: %+v, %v", fresh, err)
			}
		}
		if err := in.Process(ctx, k, stale.Token, handler("stale", nil)); !errors.Is(err, inbox.ErrLockLost) {
			t.Fatalf("Process with a lost lock = %v, want ErrLockLost", err)
		}
		if rows, msgs := count("stale"); rows != 0 || msgs != 0 {
			t.Fatalf("after a lost lock: %d business rows, %d outbox rows; want none", rows, msgs)
		}
		if err := in.Process(ctx, k, fresh.Token, handler("stale", nil)); err != nil {
			t.Fatalf("Process by the new holder: %v", err)
		}
		if rows, msgs := count("stale"); rows != 1 || msgs != 1 {
			t.Fatalf("after the new holder: %d business rows, %d outbox rows; want 1, 1", rows, msgs)
		}

		// ProcessAndLock shares its transaction the same way.
		k = inbox.Key{MessageID: "once", ConsumerType: "c"}
		if ok, err := in.ProcessAndLock(ctx, k, handler("once", nil)); !ok || err != nil {
			t.Fatalf("ProcessAndLock = %v, %v", ok, err)
		}
		if ok, err := in.ProcessAndLock(ctx, k, handler("once", nil)); ok || err != nil {
			t.Fatalf("duplicate ProcessAndLock = %v, %v", ok, err)
		}
		if rows, msgs := count("once"); rows != 1 || msgs != 1 {
			t.Fatalf("after ProcessAndLock: %d business rows, %d outbox rows; want 1, 1", rows, msgs)
		}
	})
}

// TestProcessAndLockTakesOverAbandoned covers gormstore's choice for an
// entry left unprocessed by a released or expired two-phase lock:
// ProcessAndLock processes it rather than reporting a duplicate.
func TestProcessAndLockTakesOverAbandoned(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := b.newStore(t)
		in := s.Inbox()
		k := inbox.Key{MessageID: "m", ConsumerType: "c"}
		l, err := in.TryLock(ctx, k, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Release(ctx, k, l.Token); err != nil {
			t.Fatal(err)
		}
		ran := false
		ok, err := in.ProcessAndLock(ctx, k, func(context.Context) error { ran = true; return nil })
		if !ok || err != nil || !ran {
			t.Fatalf("ProcessAndLock on a released entry = %v, %v (ran %v); want it processed", ok, err, ran)
		}
		if l, err := in.TryLock(ctx, k, time.Minute); err != nil || l.State != inbox.Processed {
			t.Fatalf("TryLock after = %+v, %v; want processed", l, err)
		}
	})
}

// TestInboxForceRelease: an operator drops a lock whatever its token; the
// next delivery takes the entry at once and the old holder cannot commit.
// Only locked, unprocessed entries are released, and only the one key.
func TestInboxForceRelease(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := b.newStore(t)
		in := s.Inbox()
		k := inbox.Key{MessageID: "stuck", ConsumerType: "billing"}
		other := inbox.Key{MessageID: "stuck", ConsumerType: "audit"}
		stuck, err := in.TryLock(ctx, k, time.Hour)
		if err != nil || stuck.State != inbox.Acquired {
			t.Fatalf("TryLock = %+v, %v", stuck, err)
		}
		if l, err := in.TryLock(ctx, other, time.Hour); err != nil || l.State != inbox.Acquired {
			t.Fatalf("TryLock other = %+v, %v", l, err)
		}
		if ok, err := in.ForceRelease(ctx, inbox.Key{MessageID: "nope", ConsumerType: "billing"}); ok || err != nil {
			t.Errorf("ForceRelease of a missing entry = %v, %v; want false, nil", ok, err)
		}
		if ok, err := in.ForceRelease(ctx, k); !ok || err != nil {
			t.Fatalf("ForceRelease = %v, %v; want true", ok, err)
		}
		if ok, err := in.ForceRelease(ctx, k); ok || err != nil {
			t.Errorf("second ForceRelease = %v, %v; want false (no lock left)", ok, err)
		}
		if l, err := in.TryLock(ctx, other, time.Hour); err != nil || l.State != inbox.Busy {
			t.Errorf("TryLock other after the release = %+v, %v; want it still busy", l, err)
		}
		next, err := in.TryLock(ctx, k, time.Hour)
		if err != nil || next.State != inbox.Acquired {
			t.Fatalf("TryLock after ForceRelease = %+v, %v; want acquired at once", next, err)
		}
		if err := in.Process(ctx, k, stuck.Token, func(context.Context) error { return nil }); !errors.Is(err, inbox.ErrLockLost) {
			t.Errorf("Process with the released token = %v; want ErrLockLost", err)
		}
		if err := in.Process(ctx, k, next.Token, func(context.Context) error { return nil }); err != nil {
			t.Fatalf("Process with the new token: %v", err)
		}
		if ok, err := in.ForceRelease(ctx, k); ok || err != nil {
			t.Errorf("ForceRelease of a processed entry = %v, %v; want false", ok, err)
		}
		es, err := in.List(ctx, inbox.Query{MessageID: k.MessageID, ConsumerType: k.ConsumerType})
		if err != nil || len(es) != 1 || es[0].ProcessedAt == nil || es[0].Attempts != 2 {
			t.Errorf("entry after = %+v, %v; want processed, 2 attempts (the release keeps the count)", es, err)
		}
	})
}

func TestTxContext(t *testing.T) {
	ctx := context.Background()
	if _, ok := gormstore.TxFromContext(ctx); ok {
		t.Fatal("empty context carries a transaction")
	}
	db, err := gormstore.OpenSQLite("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(t, db) })
	if got, ok := gormstore.TxFromContext(gormstore.WithTx(ctx, db)); !ok || got != db {
		t.Fatal("TxFromContext did not return the transaction WithTx stored")
	}
	if _, ok := gormstore.TxFromContext(gormstore.WithTx(ctx, nil)); ok {
		t.Fatal("a nil transaction counts as a transaction")
	}
}

func TestBadArguments(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, db := b.newStore(t)
		if _, err := s.Inbox().TryLock(ctx, inbox.Key{MessageID: "m", ConsumerType: "c"}, 0); err == nil {
			t.Error("TryLock with a zero timeout succeeded")
		}
		if _, err := s.Inbox().Cleanup(ctx, time.Hour, 0); err == nil {
			t.Error("inbox Cleanup with batch 0 succeeded")
		}
		if _, err := s.Outbox().Cleanup(ctx, time.Hour, 0); err == nil {
			t.Error("outbox Cleanup with batch 0 succeeded")
		}
		if _, err := s.Outbox().Claim(ctx, "relay", 0, time.Minute); err == nil {
			t.Error("Claim with limit 0 succeeded")
		}
		if _, err := s.Outbox().Claim(ctx, "", 1, time.Minute); err == nil {
			t.Error("Claim without an owner succeeded")
		}
		for _, bad := range []*outbox.Message{nil, {Destination: "queue:q"}, {MessageID: "m"}} {
			err := inTx(db)(ctx, func(ctx context.Context) error { return s.Outbox().Add(ctx, []*outbox.Message{bad}) })
			if err == nil {
				t.Errorf("Add(%+v) succeeded", bad)
			}
		}
		if err := inTx(db)(ctx, func(ctx context.Context) error { return s.Outbox().Add(ctx, nil) }); err != nil {
			t.Errorf("Add of no messages: %v", err)
		}
	})
}

// TestLargeBatches crosses the per-statement row and id limits.
func TestLargeBatches(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, db := b.newStore(t)
		const n = 1200 // past the 1000-row INSERT and 1000-id statement limits
		msgs := make([]*outbox.Message, n)
		for i := range msgs {
			msgs[i] = &outbox.Message{MessageID: "m", Destination: "queue:q", Payload: []byte{byte(i)}}
		}
		if err := inTx(db)(ctx, func(ctx context.Context) error { return s.Outbox().Add(ctx, msgs) }); err != nil {
			t.Fatalf("Add(%d): %v", n, err)
		}
		for i := 1; i < n; i++ {
			if msgs[i].ID != msgs[i-1].ID+1 {
				t.Fatalf("ids not consecutive at %d: %d after %d", i, msgs[i].ID, msgs[i-1].ID)
			}
		}
		got, err := s.Outbox().Claim(ctx, "relay", n, time.Minute)
		if err != nil || len(got) != n {
			t.Fatalf("Claim(%d) = %d rows, %v", n, len(got), err)
		}
		for i, m := range got {
			if m.ID != msgs[i].ID || m.Payload[0] != byte(i) {
				t.Fatalf("row %d: id %d payload %x, want id %d payload %x", i, m.ID, m.Payload, msgs[i].ID, byte(i))
			}
		}
		ids := make([]int64, n)
		for i, m := range got {
			ids[i] = m.ID
		}
		if changed, err := s.Outbox().MarkDelivered(ctx, "relay", ids, false); err != nil || changed != n {
			t.Fatalf("MarkDelivered(%d) = %d, %v", n, changed, err)
		}
	})
}

func TestListenWakesOnCommit(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	out := s.Outbox()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	woken := make(chan struct{}, 100)
	listenErr := make(chan error, 1)
	go func() {
		listenErr <- out.Listen(ctx, func() { woken <- struct{}{} })
	}()
	add := func(ctx context.Context, id string) error {
		return out.Add(ctx, []*outbox.Message{{MessageID: id, Destination: "queue:q"}})
	}

	// Listen has no ready signal: commit until a wake-up shows it listens.
	listening := false
	for deadline := time.Now().Add(10 * time.Second); !listening && time.Now().Before(deadline); {
		if err := inTx(db)(ctx, func(ctx context.Context) error { return add(ctx, "probe") }); err != nil {
			t.Fatalf("Add: %v", err)
		}
		select {
		case <-woken:
			listening = true
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !listening {
		t.Fatal("Listen never woke on committed Adds")
	}
	drain := func() {
		for {
			select {
			case <-woken:
			case <-time.After(200 * time.Millisecond):
				return
			}
		}
	}
	drain()

	// One transaction, two Adds: no wake-up before commit, one after.
	added := make(chan struct{})
	commit := make(chan struct{})
	txDone := make(chan error, 1)
	go func() {
		txDone <- inTx(db)(ctx, func(ctx context.Context) error {
			if err := add(ctx, "a"); err != nil {
				return err
			}
			if err := add(ctx, "b"); err != nil {
				return err
			}
			close(added)
			<-commit
			return nil
		})
	}()
	select {
	case <-added:
	case err := <-txDone:
		t.Fatalf("transaction: %v", err)
	}
	select {
	case <-woken:
		t.Fatal("Listen woke before the transaction committed")
	case <-time.After(300 * time.Millisecond):
	}
	close(commit)
	if err := <-txDone; err != nil {
		t.Fatalf("transaction: %v", err)
	}
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("Listen did not wake after the commit")
	}
	select {
	case <-woken:
		t.Fatal("two Adds in one transaction woke Listen twice")
	case <-time.After(300 * time.Millisecond):
	}

	// A rolled-back transaction notifies nobody.
	_ = inTx(db)(ctx, func(ctx context.Context) error {
		if err := add(ctx, "rolled-back"); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	select {
	case <-woken:
		t.Fatal("Listen woke for a rolled-back transaction")
	case <-time.After(300 * time.Millisecond):
	}

	cancel()
	select {
	case err := <-listenErr:
		if err != nil {
			t.Fatalf("Listen after cancel = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Listen did not return after its context was cancelled")
	}
	// The listening connection was discarded, not pooled: the pool still
	// works and nobody is left listening.
	var listeners int64
	if err := db.Raw("SELECT COUNT(*) FROM pg_stat_activity WHERE query ILIKE ? AND datname = current_database() AND pid <> pg_backend_pid()",
		"LISTEN \""+s.TablePrefix()+"outbox\"%").Scan(&listeners).Error; err != nil {
		t.Fatal(err)
	}
	if listeners != 0 {
		t.Fatalf("%d connections still listen after Listen returned", listeners)
	}
}

func TestListenSQLiteWaitsForContext(t *testing.T) {
	s, _ := sqliteBackend().newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.Outbox().Listen(ctx, func() { t.Error("SQLite Listen woke") }); err != nil {
		t.Fatalf("Listen = %v, want nil", err)
	}
	if time.Since(start) < 90*time.Millisecond {
		t.Fatal("Listen returned before its context was done")
	}
}

func TestOpenSQLite(t *testing.T) {
	ctx := context.Background()
	// Two in-memory databases are independent.
	s1, _ := sqliteBackend().newStore(t)
	s2, _ := sqliteBackend().newStore(t)
	k := inbox.Key{MessageID: "m", ConsumerType: "c"}
	for _, s := range []*gormstore.Store{s1, s2} {
		if l, err := s.Inbox().TryLock(ctx, k, time.Minute); err != nil || l.State != inbox.Acquired {
			t.Fatalf("TryLock in a fresh database = %+v, %v", l, err)
		}
	}

	// A file database uses WAL and survives reopening.
	path := filepath.Join(t.TempDir(), "bus.db")
	db, err := gormstore.OpenSQLite(path)
	if err != nil {
		t.Fatalf("OpenSQLite(%s): %v", path, err)
	}
	var mode string
	if err := db.Raw("PRAGMA journal_mode").Scan(&mode).Error; err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var fk int
	if err := db.Raw("PRAGMA foreign_keys").Scan(&fk).Error; err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d, %v; want 1", fk, err)
	}
	s := migrated(t, db)
	if _, err := s.Inbox().TryLock(ctx, k, time.Minute); err != nil {
		t.Fatal(err)
	}
	closeDB(t, db)

	db, err = gormstore.OpenSQLite(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	t.Cleanup(func() { closeDB(t, db) })
	s = migrated(t, db)
	if l, err := s.Inbox().TryLock(ctx, k, time.Minute); err != nil || l.State != inbox.Busy {
		t.Fatalf("TryLock after reopening = %+v, %v; want the lock kept", l, err)
	}
}

// TestInMemorySurvivesCancelledTransaction: database/sql discards the
// connection of a transaction whose context is cancelled mid-statement; the
// in-memory database must survive that (it did not before the anchor).
func TestInMemorySurvivesCancelledTransaction(t *testing.T) {
	db, err := gormstore.OpenSQLite("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(t, db) })
	store := migrated(t, db)
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			// A statement still running when the context ends.
			return tx.Exec("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 100000000) SELECT count(*) FROM c").Error
		})
		cancel()
		if err == nil {
			t.Fatal("the long statement was not interrupted")
		}
	}
	if _, err := store.Outbox().Stats(context.Background()); err != nil {
		t.Fatalf("tables gone after cancelled transactions: %v", err)
	}
}
