package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
)

// b.Transaction on PostgreSQL with postgresdb.Pipeline writes the outbox
// rows with the COMMIT: what is wrong with a message is still PublishTx's
// error, a rollback (fn's error, a savepoint rolled back) sends nothing,
// and a commit sends every message once. A transaction of the caller's
// own still writes the row in PublishTx.
func TestTransactionDefersOutboxToCommit(t *testing.T) {
	t.Parallel()
	env := newRealEnv(t)
	typ := env.typ("PaymentReceived")
	rec := newRecorder()
	q := env.q("deferred")
	orders := env.prefix + "orders"
	env.tables = append(env.tables, orders)
	if err := env.db.Exec("CREATE TABLE " + orders + " (id text PRIMARY KEY)").Error; err != nil {
		t.Fatal(err)
	}
	b := start(t, append(env.options(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint(q, func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer(q, rec), endpoint.AsMessageType(typ))
		})
	}), bus.WithMaxMessageSize(1024))...)
	ctx := context.Background()
	h := func(id string) bus.Headers {
		return bus.Headers{bus.HeaderMessageID: id + "-" + env.suffix, bus.HeaderMessageType: typ}
	}
	outboxRows := func(db *gorm.DB) int64 {
		t.Helper()
		var n int64
		if err := db.Raw("SELECT count(*) FROM " + env.prefix + "outbox").Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Refused at PublishTx; the transaction goes on and commits.
	err := b.Transaction(ctx, func(tx *gorm.DB) error {
		if gormstore.DeferredOf(tx) == nil {
			t.Error("b.Transaction on postgresdb.Open: not a deferred transaction")
		}
		big := bus.Raw{Type: typ, ContentType: "application/json", Body: []byte(`"` + strings.Repeat("x", 2000) + `"`)}
		if err := b.PublishTx(ctx, tx, big, h("big")); !errors.Is(err, bus.ErrMessageTooLarge) {
			t.Errorf("PublishTx of 2 kB with a 1 kB limit = %v, want ErrMessageTooLarge", err)
		}
		if err := b.PublishTx(ctx, tx, nil, h("nil")); !errors.Is(err, bus.ErrInvalidMessage) {
			t.Errorf("PublishTx(nil) = %v, want ErrInvalidMessage", err)
		}
		return tx.Exec("INSERT INTO "+orders+" (id) VALUES (?)", "o1").Error
	})
	if err != nil {
		t.Fatal(err)
	}

	// Rolled back by fn: nothing written, nothing sent.
	declined := errors.New("declined")
	err = b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "rolled-back"}, h("rb")); err != nil {
			return err
		}
		return declined
	})
	if !errors.Is(err, declined) {
		t.Fatalf("Transaction = %v, want fn's error", err)
	}

	// Committed: three messages, one of them in a savepoint that rolls back.
	err = b.Transaction(ctx, func(tx *gorm.DB) error {
		if err := tx.Exec("INSERT INTO "+orders+" (id) VALUES (?)", "o2").Error; err != nil {
			return err
		}
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "p1"}, h("p1")); err != nil {
			return err
		}
		_ = tx.Transaction(func(tx2 *gorm.DB) error {
			if err := b.PublishTx(ctx, tx2, PaymentReceived{PaymentID: "savepoint"}, h("sp")); err != nil {
				return err
			}
			return declined
		})
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "p2"}, h("p2")); err != nil {
			return err
		}
		return b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "p3"}, h("p3"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := outboxRows(env.db); n != 3 {
		t.Fatalf("%d outbox rows after the commit, want 3 (p1, p2, p3)", n)
	}

	// A transaction of the caller's own: the row is written by PublishTx.
	err = env.db.Transaction(func(tx *gorm.DB) error {
		if err := b.PublishTx(ctx, tx, PaymentReceived{PaymentID: "own"}, h("own")); err != nil {
			return err
		}
		if n := outboxRows(tx); n != 4 {
			t.Errorf("%d outbox rows inside the caller's transaction after PublishTx, want 4", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	got := rec.wait(t, 4)
	waitStats(t, b, func(s bus.Stats) bool { return s.Consumed >= 4 })
	ids := map[string]bool{}
	for _, s := range rec.snapshot() {
		ids[s.Payment.PaymentID] = true
	}
	if len(got) != 4 || len(rec.snapshot()) != 4 || !ids["p1"] || !ids["p2"] || !ids["p3"] || !ids["own"] {
		t.Fatalf("consumed %v, want p1, p2, p3 and own once each", ids)
	}
	var n int64
	if err := env.db.Raw("SELECT count(*) FROM " + orders).Scan(&n).Error; err != nil || n != 2 {
		t.Fatalf("%d orders (%v), want 2", n, err)
	}
}
