package pgerr_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/barewire-go/barewire/internal/pgerr"
	"github.com/barewire-go/barewire/internal/testenv"
)

// wrapped hides err under the wrappings callers add: fmt's %w, a join with
// another error, and a second %w.
func wrapped(err error) error {
	return fmt.Errorf("bus: relay: %w", errors.Join(errors.New("first"), fmt.Errorf("claim: %w", err)))
}

func TestSQLState(t *testing.T) {
	pgxErr := &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	pqErr := &pq.Error{Code: "55P03", Message: "lock not available"}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"plain", errors.New("40P01"), ""},
		{"pgx", pgxErr, "40P01"},
		{"pgx wrapped", wrapped(pgxErr), "40P01"},
		{"lib/pq", pqErr, "55P03"},
		{"lib/pq wrapped", wrapped(pqErr), "55P03"},
	} {
		if got := pgerr.SQLState(tc.err); got != tc.want {
			t.Errorf("%s: SQLState(%v) = %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
}

// refusedAddr is a local TCP address that refuses connections: a port
// that was listening and is closed again.
func refusedAddr(t *testing.T) (host, port string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

// TestIsConnectError: a failed connection attempt is recognised through
// pgx's own API and through database/sql on pgx's stdlib driver (the
// path GORM takes), wrapped or not; a server's error and look-alike
// texts are not.
func TestIsConnectError(t *testing.T) {
	host, port := refusedAddr(t)
	dsn := fmt.Sprintf("host=%s port=%s user=nobody dbname=nothing sslmode=disable connect_timeout=5", host, port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, direct := pgconn.Connect(ctx, dsn)
	var ce *pgconn.ConnectError
	if !errors.As(direct, &ce) {
		t.Fatalf("pgconn.Connect to a closed port: %v (%T), want a *pgconn.ConnectError", direct, direct)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDB(*cfg)
	defer sqlDB.Close()
	viaSQL := sqlDB.PingContext(ctx)
	if viaSQL == nil {
		t.Fatal("ping of a closed port succeeded")
	}

	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"pgconn.Connect", direct, true},
		{"pgconn.Connect wrapped", wrapped(direct), true},
		{"database/sql ping", viaSQL, true},
		{"database/sql ping wrapped", wrapped(viaSQL), true},
		{"server error", &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}, false},
		{"same text", errors.New(direct.Error()), false},
		{"net error", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, false},
	} {
		if got := pgerr.IsConnectError(tc.err); got != tc.want {
			t.Errorf("%s: IsConnectError(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestIsCommitRollback: pgx's ErrTxCommitRollback is recognised by its
// text, which this test pins against pgx's; on a server, COMMIT of a
// transaction aborted by a failed statement returns it, through pgx and
// through database/sql.
func TestIsCommitRollback(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"pgx.ErrTxCommitRollback", pgx.ErrTxCommitRollback, true},
		{"wrapped", wrapped(pgx.ErrTxCommitRollback), true},
		{"aborted transaction", &pgconn.PgError{Code: "25P02", Message: "current transaction is aborted"}, false},
		{"other", errors.New("commit failed"), false},
	} {
		if got := pgerr.IsCommitRollback(tc.err); got != tc.want {
			t.Errorf("%s: IsCommitRollback(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}

	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("pgx", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, stmtErr := tx.Exec(ctx, "SELECT 1/0")
		if got := pgerr.SQLState(stmtErr); got != "22012" {
			t.Errorf("SQLState of division by zero = %q (%v), want 22012", got, stmtErr)
		}
		if err := tx.Commit(ctx); !pgerr.IsCommitRollback(fmt.Errorf("commit: %w", err)) {
			t.Errorf("COMMIT of an aborted transaction: %v, want ErrTxCommitRollback", err)
		}
	})
	t.Run("database/sql", func(t *testing.T) {
		sqlDB, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer sqlDB.Close()
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, stmtErr := tx.ExecContext(ctx, "SELECT 1/0")
		if got := pgerr.SQLState(fmt.Errorf("exec: %w", stmtErr)); got != "22012" {
			t.Errorf("SQLState of division by zero = %q (%v), want 22012", got, stmtErr)
		}
		if err := tx.Commit(); !pgerr.IsCommitRollback(fmt.Errorf("commit: %w", err)) {
			t.Errorf("COMMIT of an aborted transaction: %v, want ErrTxCommitRollback", err)
		}
	})
}

// TestConnectionClass: what the bus and the PostgreSQL transport count as
// "the database is unreachable" rather than a verdict on the statement.
func TestConnectionClass(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"terminated session 57P01", wrapped(&pgconn.PgError{Code: "57P01"}), true},
		{"cannot connect now 57P03", wrapped(&pgconn.PgError{Code: "57P03"}), true},
		{"connection failure 08006", &pq.Error{Code: "08006"}, true},
		{"unique violation 23505", wrapped(&pgconn.PgError{Code: "23505"}), false},
		{"invalid text 22021", &pgconn.PgError{Code: "22021"}, false},
		{"bad conn", fmt.Errorf("x: %w", errBadConn()), true},
		{"network", wrapped(&net.OpError{Op: "read", Err: errors.New("reset")}), true},
		{"plain", errors.New("consumer said no"), false},
	} {
		if got := pgerr.ConnectionClass(c.err); got != c.want {
			t.Errorf("%s: ConnectionClass = %v, want %v", c.name, got, c.want)
		}
	}
}

func errBadConn() error { return sql.ErrConnDone }
