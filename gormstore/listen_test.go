package gormstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/lib/pq" // a PostgreSQL driver that is not pgx
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/barewire-go/barewire/gormstore"
)

// TestListenWakesOnNotifyFromAnotherConnection: Listen drives pgx by
// reflection (gormstore links no driver) and is woken by a NOTIFY on its
// channel from another connection — another process's commit watcher —
// once per notification, and not by a NOTIFY on another channel.
func TestListenWakesOnNotifyFromAnotherConnection(t *testing.T) {
	b := postgresBackend(t)
	s, db := b.newStore(t)
	channel := s.TablePrefix() + "outbox"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	other, err := pgx.Connect(ctx, os.Getenv(postgresDSNEnv))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer other.Close(context.Background())
	notify := func(channel, payload string) {
		t.Helper()
		if _, err := other.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
			t.Fatalf("pg_notify: %v", err)
		}
	}

	woken := make(chan struct{}, 10)
	listenErr := make(chan error, 1)
	go func() { listenErr <- s.Outbox().Listen(ctx, func() { woken <- struct{}{} }) }()

	// Listen has no ready signal: its session listens once its LISTEN has
	// completed (autocommit), which pg_stat_activity shows.
	waitFor(t, "Listen's session to listen", func() bool {
		select {
		case err := <-listenErr:
			t.Fatalf("Listen returned early: %v", err)
		default:
		}
		var n int64
		if err := db.Raw(`SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' AND query = ?`,
			`LISTEN "`+channel+`"`).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n == 1
	})

	notify(s.TablePrefix()+"elsewhere", "x") // first: it would wake Listen before the next one
	notify(channel, "a commit in another process")
	select {
	case <-woken:
	case err := <-listenErr:
		t.Fatalf("Listen returned: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("a NOTIFY from another connection did not wake Listen")
	}
	select {
	case <-woken:
		t.Fatal("one NOTIFY on the channel (and one elsewhere) woke Listen twice")
	case <-time.After(300 * time.Millisecond):
	}
	notify(channel, "another")
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("a second NOTIFY did not wake Listen")
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
}

// TestListenRefusesAnotherDriver: on a PostgreSQL database opened through
// a driver other than pgx (lib/pq here), Listen fails at once and says
// what it needs, instead of waiting; the relay then polls.
func TestListenRefusesAnotherDriver(t *testing.T) {
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		t.Skipf("PostgreSQL tests skipped: set %s", postgresDSNEnv)
	}
	sqlDB, err := sql.Open("postgres", dsn) // lib/pq
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := gormstore.New(db, gormstore.WithTablePrefix(randomPrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = s.Outbox().Listen(ctx, func() { t.Error("Listen woke") })
	if ctx.Err() != nil {
		t.Fatal("Listen waited for its context instead of failing")
	}
	if err == nil || !strings.Contains(err.Error(), "need the pgx stdlib driver (gorm.io/driver/postgres's default), have *pq.conn") {
		t.Fatalf("Listen on lib/pq = %v, want the pgx driver asked for", err)
	}
	// The refused connection was discarded, and the pool still works.
	if err := db.Exec("SELECT 1").Error; err != nil {
		t.Fatalf("pool after the refusal: %v", err)
	}
}

type noConnMethod struct{}

type notPgx struct{}

type otherDriverConn struct{}

func (otherDriverConn) Conn() *notPgx { return &notPgx{} }

type nilPgxConn struct{}

func (nilPgxConn) Conn() *pgx.Conn { return nil }

type connWithArgs struct{}

func (connWithArgs) Conn(int) *pgx.Conn { return nil }

// TestPgxConnRefusesOtherConnections: Listen accepts only pgx's stdlib
// connection, without panicking on look-alikes, and names what it got.
func TestPgxConnRefusesOtherConnections(t *testing.T) {
	for _, dc := range []any{nil, 42, &noConnMethod{}, (*noConnMethod)(nil), otherDriverConn{}, (*otherDriverConn)(nil), nilPgxConn{}, connWithArgs{}} {
		err := gormstore.PgxConnError(dc)
		want := fmt.Sprintf("gormstore: listen: need the pgx stdlib driver (gorm.io/driver/postgres's default), have %T", dc)
		if err == nil || err.Error() != want {
			t.Errorf("pgxConn(%T) = %v, want %q", dc, err, want)
		}
	}
}

// TestPgxConnAcceptsPgx: database/sql's driver connection on the pgx
// stdlib driver (what gorm.io/driver/postgres opens) is accepted.
func TestPgxConnAcceptsPgx(t *testing.T) {
	b := postgresBackend(t)
	sqlDB, err := b.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := sqlDB.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Raw(func(dc any) error { return gormstore.PgxConnError(dc) }); err != nil {
		t.Fatalf("pgxConn on pgx's stdlib connection: %v", err)
	}
}
