package bus_test

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// TestRabbitSlowPlainTransactionRelayedAtCommit: a transaction the caller
// manages (db.Transaction, not b.Transaction) that commits long after its
// PublishTx is relayed at its commit, not at the next poll: the store's
// commit watcher wakes the relay. Its own notifications are skipped by the
// bus's LISTEN, so this fails if the watcher's direct wake-up is lost.
func TestRabbitSlowPlainTransactionRelayedAtCommit(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("SlowTx")
	rec := newRecorder()
	q := env.q("slow-tx")
	b := start(t, env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer(q, rec), endpoint.AsMessageType(typ))
		})
	}, func(o *outbox.Options) { o.PollingInterval = time.Minute })...)
	ctx := context.Background()
	var committed time.Time
	if err := env.db.Transaction(func(tx *gorm.DB) error {
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "slow"}, bus.Headers{bus.HeaderMessageType: typ}); err != nil {
			return err
		}
		// The transaction's own work, longer than the relay's re-checks
		// after PublishTx's early wake-up (about 200 ms).
		time.Sleep(500 * time.Millisecond)
		committed = time.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, 1)
	if got[0].Payment.PaymentID != "slow" {
		t.Fatalf("got %+v", got[0])
	}
	// Far below the 1-minute poll; generous for a loaded machine.
	if d := time.Since(committed); d > 10*time.Second {
		t.Fatalf("consumed %v after the commit; the relay waited for its poll", d)
	} else {
		t.Logf("consumed %v after the commit", d)
	}
}
