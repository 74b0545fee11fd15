package bus_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/inbox"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// waitFor polls cond: used only where no signal exists (database state).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// drain waits until the bus has been idle for several consecutive checks.
func drain(t *testing.T, b *bus.Bus) {
	t.Helper()
	stable := 0
	waitFor(t, func() bool {
		if bus.IdleForTest(b) {
			stable++
		} else {
			stable = 0
		}
		return stable >= 10
	})
}

func processedEntries(t *testing.T, b *bus.Bus, id string) int {
	t.Helper()
	yes := true
	es, err := b.InboxStore().List(context.Background(), inbox.Query{MessageID: id, Processed: &yes})
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
