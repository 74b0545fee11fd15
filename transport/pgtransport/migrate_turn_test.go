package pgtransport_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/transport/pgtransport"
)

// TestStartWaitsForAnotherMigratorWithABound: a process that holds the
// migration turn of the same tables (frozen mid-migration, its
// transaction open) fails Start after the turn timeout with an error that
// says so, instead of hanging it; once the turn is free Start succeeds.
func TestStartWaitsForAnotherMigratorWithABound(t *testing.T) {
	e := newEnv(t)
	defer pgtransport.SetMigrateTurnTimeout("1s")()
	release := testenv.HoldInTransaction(t, e.db, func(tx *gorm.DB) error { return pgtransport.HoldMigrateTurn(tx, e.prefix) })
	tr, err := pgtransport.Open(e.db, pgtransport.Config{TablePrefix: e.prefix}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	// A deadline far beyond the turn timeout: without the bound, Start
	// would wait for it and fail with it.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	err = tr.Start(ctx, nil)
	took := time.Since(start)
	releaseErr := release()
	_ = tr.Close()
	if err == nil {
		t.Fatal("Start succeeded while another process held the migration turn")
	}
	if !strings.Contains(err.Error(), "held the migration lock of tables") {
		t.Errorf("the error does not say another process holds the turn: %v", err)
	}
	if took > 10*time.Second {
		t.Errorf("Start took %v with a turn timeout of 1s", took)
	}
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	e.start(t, pgtransport.Config{}, nil)
}
