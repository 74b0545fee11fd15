package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/saga"
)

type cliOrderPlaced struct{ ID string }

type cliOrder struct {
	saga.State
	Amount float64
	Note   string
}

// seedSaga creates table as saga.Migrate does and writes 2 instances in
// AwaitingPayment and 1 in Shipped.
func seedSaga(t *testing.T, db *gorm.DB, table string) {
	t.Helper()
	m, err := saga.New("cli-orders", func(m *saga.Machine[cliOrder]) {
		saga.NewEvent(m, func(e cliOrderPlaced) string { return e.ID })
	}, saga.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := saga.Migrate(context.Background(), db, m); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rows := []cliOrder{
		{State: saga.State{CorrelationID: "o-1", CurrentState: "AwaitingPayment", Version: 1, CreatedAt: now.Add(-3 * time.Hour), UpdatedAt: now.Add(-3 * time.Hour)}, Amount: 10},
		{State: saga.State{CorrelationID: "o-2", CurrentState: "AwaitingPayment", Version: 1, CreatedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-time.Hour)}, Amount: 20},
		{State: saga.State{CorrelationID: "o-3", CurrentState: "Shipped", Version: 2, CreatedAt: now, UpdatedAt: now}, Amount: 30, Note: "fragile"},
	}
	if err := db.Table(table).Create(&rows).Error; err != nil {
		t.Fatal(err)
	}
}

func testCLISaga(t *testing.T, dsn, table string) {
	out := ok(t, "saga", "states", "--dsn", dsn, "--table", table, "--json")
	states := decode[[]struct {
		State     string `json:"state"`
		Instances int64  `json:"instances"`
	}](t, out)
	if len(states) != 2 || states[0].State != "AwaitingPayment" || states[0].Instances != 2 || states[1].State != "Shipped" || states[1].Instances != 1 {
		t.Errorf("saga states: %+v", states)
	}
	out = ok(t, "saga", "ls", "--dsn", dsn, "--table", table, "--state", "AwaitingPayment", "--json")
	list := decode[[]map[string]any](t, out)
	if len(list) != 2 || list[0]["correlation_id"] != "o-1" || list[1]["correlation_id"] != "o-2" {
		t.Errorf("saga ls --state AwaitingPayment (least recently changed first): %v", list)
	}
	if list[0]["amount"] != 10.0 {
		t.Errorf("the instance's data column is missing: %v", list[0])
	}
	out = ok(t, "saga", "ls", "--dsn", dsn, "--table", table)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "CORRELATION ID") ||
		!strings.HasPrefix(lines[1], "o-1") || !strings.Contains(lines[1], "3h0m0s") || !strings.Contains(lines[3], "Shipped") {
		t.Errorf("saga ls table:\n%s", out)
	}
	out = ok(t, "saga", "show", "--dsn", dsn, "--table", table, "o-3")
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"current_state Shipped", "version 2", "amount 30 note fragile"} {
		if !strings.Contains(flat, want) {
			t.Errorf("saga show does not say %q:\n%s", want, out)
		}
	}
	show := decode[map[string]any](t, ok(t, "saga", "show", "o-3", "--dsn", dsn, "--table", table, "--json"))
	if show["correlation_id"] != "o-3" || show["note"] != "fragile" {
		t.Errorf("saga show --json: %v", show)
	}
	if _, err := time.Parse(time.RFC3339Nano, show["updated_at"].(string)); err != nil {
		t.Errorf("updated_at is not a time: %v", show["updated_at"])
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"saga", "show", "--dsn", dsn, "--table", table, "nobody"}, exitError, `saga instance "nobody" not found`},
		{[]string{"saga", "ls", "--dsn", dsn}, exitUsage, "needs --table"},
		{[]string{"saga", "ls", "--dsn", dsn, "--table", `x"; DROP TABLE y`}, exitUsage, "want a table name"},
		{[]string{"saga", "ls", "--dsn", dsn, "--table", table, "--limit", "0"}, exitUsage, "--limit"},
		{[]string{"saga", "show", "--dsn", dsn, "--table", table}, exitUsage, "one correlation id"},
		{[]string{"saga", "ls", "--dsn", dsn, "--table", "no_such_saga_table"}, exitError, "read saga table no_such_saga_table"},
		{[]string{"saga", "rm", "--dsn", dsn}, exitUsage, `unknown command "saga rm"`},
		{[]string{"saga"}, exitUsage, "states, ls or show"},
	} {
		code, _, errOut := barewire(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("barewire %v = %d %q; want %d and %q", tc.args[:2], code, errOut, tc.code, tc.want)
		}
	}
}

func TestCLISagaSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bus.db")
	db, err := gormstore.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	seedSaga(t, db, "orders")
	testCLISaga(t, "sqlite:"+path, "orders")
}

func TestCLISagaPostgres(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	table := "cli_saga_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	t.Cleanup(func() {
		db.Exec(`DROP TABLE IF EXISTS "` + table + `"`)
		closeDB(db)
	})
	seedSaga(t, db, table)
	testCLISaga(t, dsn, table)
}
