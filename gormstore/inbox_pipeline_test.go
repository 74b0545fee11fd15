package gormstore_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// writeCounter counts the client's writes to PostgreSQL: one per round
// trip (pgx flushes a statement, a batch or a pipeline in one write).
type writeCounter struct{ n atomic.Int64 }

type countedConn struct {
	net.Conn
	w *writeCounter
}

func (c countedConn) Write(b []byte) (int, error) {
	c.w.n.Add(1)
	return c.Conn.Write(b)
}

// countedStore is a migrated PostgreSQL store on a pool whose writes are
// counted, with pipeline: the Pipeline plugin registered.
func countedStore(t *testing.T, pipeline bool) (*gormstore.Store, *gorm.DB, *writeCounter, string) {
	t.Helper()
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		t.Skipf("PostgreSQL tests skipped: set %s", postgresDSNEnv)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	w := &writeCounter{}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countedConn{Conn: c, w: w}, nil
	}
	// No ping when a connection is reused after a second's idleness (a
	// slow machine): it would be counted.
	sqlDB := stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }))
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	if pipeline {
		if err := db.Use(postgresdb.Pipeline()); err != nil {
			t.Fatal(err)
		}
	}
	s := migrated(t, db, gormstore.WithTablePrefix(randomPrefix(t)))
	business := s.TablePrefix() + "business"
	if err := db.Exec("CREATE TABLE " + business + " (id text PRIMARY KEY)").Error; err != nil {
		t.Fatal(err)
	}
	// No commit watcher: its queries would be counted.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dropTables(t, db, s.TablePrefix())
		_ = sqlDB.Close()
	})
	return s, db, w, business
}

// consume is a consumer's work: a business row and, with publish, a
// message through the outbox, both in the transaction of ctx.
func consume(s *gormstore.Store, business, id string, publish bool) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		tx, _ := gormstore.TxFromContext(ctx)
		if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", id).Error; err != nil {
			return err
		}
		if publish {
			return s.Outbox().Add(ctx, []*outbox.Message{msg("out-"+id, "Out")})
		}
		return nil
	}
}

// TestLockAndProcessRoundTrips counts what the consumer's inbox sends: with
// the Pipeline plugin, the lock and BEGIN in one write, the consumer's
// statement, and the processed mark, the outbox rows and the COMMIT in one
// write: three round trips, with or without a published message. Without
// the plugin, five (TryLock, BEGIN, the statement, mark, COMMIT) and one
// more per published message.
func TestLockAndProcessRoundTrips(t *testing.T) {
	for _, c := range []struct {
		name     string
		pipeline bool
		publish  bool
		want     int64
	}{
		{"pipelined", true, false, 3},
		{"pipelined/publish", true, true, 3},
		{"plain", false, false, 5},
		{"plain/publish", false, true, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, db, w, business := countedStore(t, c.pipeline)
			ctx := context.Background()
			in := s.Inbox()
			for i, id := range []string{"warm-1", "warm-2", "m"} { // pgx prepares a statement on its first use
				before := w.n.Load()
				l, err := in.LockAndProcess(ctx, inbox.Key{MessageID: id, ConsumerType: "c"}, time.Minute, consume(s, business, id, c.publish))
				if err != nil || l.State != inbox.Acquired {
					t.Fatalf("LockAndProcess(%s) = %+v, %v", id, l, err)
				}
				if got := w.n.Load() - before; i == 2 && got != c.want {
					t.Errorf("%d round trips, want %d", got, c.want)
				}
			}
			if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"inbox WHERE processed_at IS NOT NULL"); n != 3 {
				t.Errorf("%d processed entries, want 3", n)
			}
			if n := count(t, db, "SELECT count(*) FROM "+business); n != 3 {
				t.Errorf("%d business rows, want 3", n)
			}
			want := int64(0)
			if c.publish {
				want = 3
			}
			if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != want {
				t.Errorf("%d outbox rows, want %d", n, want)
			}
		})
	}
}

// TestLockAndProcessLockLostAtCommit: the lock is taken over while the
// consumer runs; the mark sent with the COMMIT fails, the COMMIT does not
// run: nothing of the consumer's commits (its row, its message), the
// result is ErrLockLost, and the new holder's lock stands.
func TestLockAndProcessLockLostAtCommit(t *testing.T) {
	s, db, _ := deferredSetup(t)
	business := s.TablePrefix() + "business"
	ctx := context.Background()
	in := s.Inbox()
	k := inbox.Key{MessageID: "m", ConsumerType: "c"}
	var thief inbox.Lock
	l, err := in.LockAndProcess(ctx, k, time.Minute, func(ctx context.Context) error {
		if err := consume(s, business, "m", true)(ctx); err != nil {
			return err
		}
		if d := gormstore.DeferredOf(mustTx(t, ctx)); d == nil || d.Pending() != 1 {
			t.Errorf("consumer's transaction %v: want a deferred one holding the message", d)
		}
		// Another delivery takes the lock over (an operator's release,
		// then its lock), on another connection.
		if ok, err := in.ForceRelease(ctx, k); err != nil || !ok {
			t.Fatalf("ForceRelease = %v, %v", ok, err)
		}
		var err error
		if thief, err = in.TryLock(ctx, k, time.Minute); err != nil || thief.State != inbox.Acquired {
			t.Fatalf("thief's TryLock = %+v, %v", thief, err)
		}
		return nil
	})
	if !errors.Is(err, inbox.ErrLockLost) || l.State != inbox.Acquired {
		t.Fatalf("LockAndProcess = %+v, %v; want acquired, ErrLockLost", l, err)
	}
	if n := count(t, db, "SELECT count(*) FROM "+business); n != 0 {
		t.Errorf("%d business rows committed by the lock loser", n)
	}
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 0 {
		t.Errorf("%d outbox rows committed by the lock loser", n)
	}
	// The thief's lock holds; it processes the message once.
	if got, err := in.TryLock(ctx, k, time.Minute); err != nil || got.State != inbox.Busy {
		t.Fatalf("TryLock after the lost commit = %+v, %v; want busy", got, err)
	}
	if err := in.Process(ctx, k, thief.Token, consume(s, business, "m", true)); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, "SELECT count(*) FROM "+business); n != 1 {
		t.Errorf("%d business rows, want 1", n)
	}
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"outbox"); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
	// The pool is still usable: the failed transaction was rolled back.
	l, err = in.LockAndProcess(ctx, inbox.Key{MessageID: "n", ConsumerType: "c"}, time.Minute, consume(s, business, "n", false))
	if err != nil || l.State != inbox.Acquired {
		t.Fatalf("LockAndProcess after a lost lock = %+v, %v", l, err)
	}
}

// TestLockAndProcessSavepoint: after a savepoint in the consumer's
// transaction messages are written at once, so that a rollback to it
// takes them; the mark still goes with the COMMIT.
func TestLockAndProcessSavepoint(t *testing.T) {
	s, db, _ := deferredSetup(t)
	ctx := context.Background()
	in := s.Inbox()
	l, err := in.LockAndProcess(ctx, inbox.Key{MessageID: "m", ConsumerType: "c"}, time.Minute, func(ctx context.Context) error {
		tx := mustTx(t, ctx)
		if err := s.Outbox().Add(ctx, []*outbox.Message{msg("kept", "Out")}); err != nil {
			return err
		}
		err := tx.Transaction(func(tx *gorm.DB) error {
			if err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{msg("undone", "Out")}); err != nil {
				return err
			}
			return errors.New("nested transaction fails")
		})
		if err == nil {
			t.Error("nested transaction did not fail")
		}
		return s.Outbox().Add(ctx, []*outbox.Message{msg("after", "Out")})
	})
	if err != nil || l.State != inbox.Acquired {
		t.Fatalf("LockAndProcess = %+v, %v", l, err)
	}
	var ids []string
	if err := db.Raw("SELECT message_id FROM " + s.TablePrefix() + "outbox ORDER BY message_id").Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != "after" || ids[1] != "kept" {
		t.Fatalf("outbox rows %v, want [after kept]", ids)
	}
	if n := count(t, db, "SELECT count(*) FROM "+s.TablePrefix()+"inbox WHERE processed_at IS NOT NULL"); n != 1 {
		t.Fatalf("%d processed entries, want 1", n)
	}
}

func mustTx(t *testing.T, ctx context.Context) *gorm.DB {
	t.Helper()
	tx, ok := gormstore.TxFromContext(ctx)
	if !ok {
		t.Fatal("no transaction in the consumer's ctx")
	}
	return tx
}
