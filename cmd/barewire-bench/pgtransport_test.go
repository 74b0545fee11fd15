package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/internal/testenv"
)

// TestAllIncludesPGTransport: -scenario all runs pg-transport, and it is a
// known scenario on its own.
func TestAllIncludesPGTransport(t *testing.T) {
	if !slices.Contains(allScenarios, "pg-transport") || !slices.Contains(knownScenarios, "pg-transport") {
		t.Fatalf("pg-transport missing: all = %v, known = %v", allScenarios, knownScenarios)
	}
}

// TestPGTransportPipeline runs the pg-transport pipeline for a few
// messages: each committed message is consumed once, PublishTx wrote no
// outbox row (the message went to the queue table in the producer's
// transaction), and cleanup drops every table the pipeline created.
func TestPGTransportPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (needs PostgreSQL); not run with -short")
	}
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := &config{producers: 2, consumers: 2, payload: 64, inbox: endpoint.InboxTwoPhase}
	e := newEnv(dsn, "", "", false)
	tr := newTracker()
	p := newPGTransport(cfg, e, tr, "test")
	t.Cleanup(func() {
		if err := e.cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := p.Start(ctx); err != nil {
		_ = p.Close(ctx)
		t.Fatalf("start: %v", err)
	}
	ch := make(chan string, 64)
	tr.notify.Store(&ch)
	ids := &idGen{prefix: "t-" + e.suffix + "-"}
	const n = 20
	want := map[string]bool{}
	for range n {
		id := ids.next()
		want[id] = true
		if err := p.Produce(ctx, id, benchMsg{ID: id, Amount: 1, TS: time.Now().UnixNano(), Pad: padding(cfg.payload)}); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	for len(want) > 0 {
		select {
		case id := <-ch:
			delete(want, id)
		case <-ctx.Done():
			t.Fatalf("%d messages not consumed: %v", len(want), ctx.Err())
		}
	}
	effects, distinct, err := p.Verify(ctx)
	if err != nil || effects != n || distinct != n {
		t.Errorf("effects: %d rows, %d distinct, err %v; want %d once each", effects, distinct, err, n)
	}
	d := p.Diag(ctx)
	if got, ok := d["outbox_rows_written_by_producer"].(int64); !ok || got != 0 {
		t.Errorf("outbox rows = %v; want 0 (PublishTx writes to the queue table on the PostgreSQL transport)", d["outbox_rows_written_by_producer"])
	}
	if err := p.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := e.cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var left int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename LIKE $1", "bwb_"+e.suffix+"_%").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d tables of the run left after cleanup", left)
	}
}
