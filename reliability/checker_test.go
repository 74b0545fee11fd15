//go:build linux

package reliability_test

import (
	"context"
	"strings"
	"testing"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/reliability"
	"github.com/barewire-go/barewire/reliability/workload"
)

// TestCheckerDetectsViolations feeds the checker tables with one of each
// violation it must catch, so that a clean report means something.
func TestCheckerDetectsViolations(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx := context.Background()
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeGorm(db) })
	n := reliability.NewNames()
	t.Cleanup(func() { _ = workload.Drop(context.Background(), db, n) })
	st, err := gormstore.New(db, gormstore.WithTablePrefix(n.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := workload.Migrate(ctx, db, n); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if err := db.Exec(sql, args...).Error; err != nil {
			t.Fatal(err)
		}
	}
	ledger, notify := n.Ledger(), n.Notify()
	// Committed: a, b, c. Rolled back: r.
	for _, id := range []string{"a", "b", "c"} {
		exec(`INSERT INTO `+n.Table(workload.TableProduced)+` (message_id, producer) VALUES (?, 'p')`, id)
		exec(`INSERT INTO `+n.Table("outbox")+` (message_id, destination, message_type, payload) VALUES (?, 'exchange:x', ?, '')`, id, n.OrderType())
	}
	exec(`INSERT INTO ` + n.Table(workload.TableRolledBack) + ` (message_id) VALUES ('r')`)
	exec(`INSERT INTO `+n.Table("outbox")+` (message_id, destination, message_type, payload) VALUES ('r', 'exchange:x', ?, '')`, n.OrderType())
	effect := func(id, ep string) {
		exec(`INSERT INTO `+n.Table(workload.TableEffects)+` (message_id, endpoint, instance, attempt) VALUES (?, ?, 'i', 1)`, id, ep)
	}
	followup := func(fid, origin, ep string) {
		exec(`INSERT INTO `+n.Table(workload.TableFollowups)+` (followup_id, origin_id, source_endpoint, instance) VALUES (?, ?, ?, 'i')`, fid, origin, ep)
	}
	// ledger: a once, b twice (doubled), c missing, r (phantom).
	effect("a", ledger)
	effect("b", ledger)
	effect("b", ledger)
	effect("r", ledger)
	// notify: clean.
	for _, id := range []string{"a", "b", "c"} {
		effect(id, notify)
		followup("f-"+id+"-n", id, notify)
	}
	// follow-ups from ledger: a clean, b twice under the same follow-up id
	// (the audit inbox failed), c missing.
	followup("f-a-l", "a", ledger)
	followup("f-b-l", "b", ledger)
	followup("f-b-l", "b", ledger)
	// One unprocessed inbox entry.
	exec(`INSERT INTO `+n.Table("inbox")+` (message_id, consumer_type, expires_at, lock_token) VALUES ('c', ?, now(), 't')`, ledger)

	rep, err := reliability.Check(ctx, db, n)
	if err != nil {
		t.Fatal(err)
	}
	led := rep.Effects[0]
	if led.Missing != 1 || led.Doubled != 1 || led.ExtraRows != 1 || led.Phantom != 1 {
		t.Errorf("ledger check = %+v; want 1 missing, 1 doubled (1 extra row), 1 phantom", led)
	}
	if nt := rep.Effects[1]; nt.Missing+nt.Doubled+nt.Phantom != 0 || nt.Distinct != 3 {
		t.Errorf("notify check = %+v; want clean with 3 ids", nt)
	}
	if fl := rep.Followups[0]; fl.Missing != 1 || fl.Doubled != 1 {
		t.Errorf("follow-ups from ledger = %+v; want 1 missing, 1 doubled", fl)
	}
	if rep.FollowupIDsDoubled != 1 || rep.OutboxRolledBack != 1 || rep.OutboxPhantomOrders != 1 || rep.OutboxPending != 4 || rep.InboxUnprocessed != 1 {
		t.Errorf("report = %+v", rep)
	}
	failures := strings.Join(rep.Failures(), "\n")
	for _, want := range []string{ledger + ": 1 missing, 1 doubled", "publish without commit", "outbox not drained", "inbox not drained", "consumed more than once"} {
		if !strings.Contains(failures, want) {
			t.Errorf("failures lack %q:\n%s", want, failures)
		}
	}
}

// TestCheckerDirectDelivery checks the PostgreSQL transport's outbox rule:
// any outbox row at all fails the run (publishes must have gone straight
// to the queues), while the RabbitMQ rule (one order row per committed
// publish) no longer applies.
func TestCheckerDirectDelivery(t *testing.T) {
	rep := &reliability.Report{Committed: 3, Republished: 1, InboxProcessed: 12, DirectDelivery: true}
	if f := rep.Failures(); len(f) != 0 {
		t.Fatalf("an empty outbox on the PostgreSQL transport failed: %q", f)
	}
	rep.OutboxRows, rep.OutboxOrderRows = 1, 1
	if f := strings.Join(rep.Failures(), "\n"); !strings.Contains(f, "outbox holds 1 rows (1 orders); want none") {
		t.Fatalf("an outbox row on the PostgreSQL transport passed: %q", f)
	}
	rep.DirectDelivery = false
	if f := strings.Join(rep.Failures(), "\n"); !strings.Contains(f, "outbox holds 1 order rows; want 4") {
		t.Fatalf("the RabbitMQ rule did not apply: %q", f)
	}
}
