package pgtransport_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/tcpproxy"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/pgtransport"
)

// TestPostgresDeliverBoundedWhenTheDatabaseDoesNotAnswer (issue 33, every
// wait has a bound): a database that stops answering without closing
// anything (a partition, a frozen host; here a TCP proxy holding every
// byte) held a Deliver, and the relay worker or Stop behind it, until the
// kernel gave up on the connection. Deliver now gives up after its bound
// (half of the relay's lease, at most 30s) as "transport unavailable".
func TestPostgresDeliverBoundedWhenTheDatabaseDoesNotAnswer(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	e := newEnv(t)
	px, err := tcpproxy.New(testenv.PostgresAddr(dsn))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	db, err := postgresdb.Open(testenv.PostgresDSNVia(dsn, px.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	}()
	// The tables, through the direct connection.
	e.start(t, pgtransport.Config{}, nil, endpoints(t, map[string][]string{"silent-q": nil})...)
	tr, err := pgtransport.Open(db, pgtransport.Config{TablePrefix: e.prefix}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	tr.SetDeliverTimeout(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Start(ctx, endpoints(t, map[string][]string{"silent-q": nil})); err != nil {
		t.Fatal(err)
	}
	defer func() { px.Thaw(); _ = tr.Close() }()
	if err := tr.Deliver(ctx, []*outbox.Message{msg("before", "queue:silent-q")})[0]; err != nil {
		t.Fatalf("deliver before the freeze: %v", err)
	}
	px.Freeze()
	began := time.Now()
	err = tr.Deliver(context.Background(), []*outbox.Message{msg("frozen", "queue:silent-q")})[0]
	took := time.Since(began)
	if !errors.Is(err, outbox.ErrTransportUnavailable) {
		t.Errorf("deliver while the database does not answer = %v, want an error wrapping ErrTransportUnavailable", err)
	}
	if took > 3*time.Second {
		t.Errorf("deliver took %v with a 500ms bound", took)
	}
	t.Logf("deliver while frozen: %v after %v", err, took.Round(time.Millisecond))
}
