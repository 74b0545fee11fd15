package bus_test

import (
	"errors"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
)

type realClock struct{}

func (realClock) Now() time.Time            { return time.Now() }
func (realClock) Advanced() <-chan struct{} { return nil }

// TestWithClockNeedsSQLite: on PostgreSQL the statements decide by the
// database's clock, so a Go clock is refused with a named error, not
// silently half-applied.
func TestWithClockNeedsSQLite(t *testing.T) {
	t.Parallel()
	if _, err := bus.New(bus.WithClock(nil)); !errors.Is(err, bus.ErrInvalidOption) {
		t.Fatalf("WithClock(nil): %v, want ErrInvalidOption", err)
	}
	if _, err := bus.New(bus.WithClock(realClock{})); err != nil {
		t.Fatalf("WithClock on the embedded default: %v", err)
	}
	db, err := postgresdb.Open(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(db) })
	_, err = bus.New(bus.WithDatabase(db), bus.WithClock(realClock{}))
	if !errors.Is(err, bus.ErrClockUnsupported) || !errors.Is(err, bus.ErrInvalidOption) {
		t.Fatalf("WithClock on PostgreSQL: %v, want ErrClockUnsupported", err)
	}
}
