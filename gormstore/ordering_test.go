package gormstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
)

// TestOutboxPerKeyFIFOClaim: a row with an ordering key is claimed only
// when no older pending row has its key, whichever relay asks: rows of one
// key leave one at a time, in insert order; a released row (a failed
// delivery) keeps holding its key; a parked one lets it go on; rows without
// a key are claimed as before.
func TestOutboxPerKeyFIFOClaim(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		s, db := b.newStore(t)
		ctx := context.Background()
		o := s.Outbox()
		key := func(k string) map[string]string { return map[string]string{"BW-OrderingKey": k} }
		var msgs []*outbox.Message
		for _, m := range []struct {
			id  string
			hdr map[string]string
		}{{"a1", key("A")}, {"b1", key("B")}, {"n1", nil}, {"a2", key("A")}, {"b2", key("B")}, {"a3", key("A")}, {"n2", nil}} {
			msgs = append(msgs, &outbox.Message{MessageID: m.id, Destination: "queue:q", Headers: m.hdr})
		}
		if err := db.Transaction(func(tx *gorm.DB) error { return o.Add(gormstore.WithTx(ctx, tx), msgs) }); err != nil {
			t.Fatal(err)
		}
		byID := map[string]int64{}
		for _, m := range msgs {
			byID[m.MessageID] = m.ID
		}
		claim := func(owner string) []string {
			t.Helper()
			got, err := o.Claim(ctx, owner, 100, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range got {
				ids = append(ids, m.MessageID)
			}
			return ids
		}
		if got := claim("r1"); !slices.Equal(got, []string{"a1", "b1", "n1", "n2"}) {
			t.Fatalf("first claim %v, want the head of each key and every unkeyed row", got)
		}
		if got := claim("r2"); len(got) != 0 {
			t.Fatalf("a second relay claimed %v while the keys' heads are leased", got)
		}
		if _, err := o.MarkDelivered(ctx, "r1", []int64{byID["a1"]}, false); err != nil {
			t.Fatal(err)
		}
		if got := claim("r2"); !slices.Equal(got, []string{"a2"}) {
			t.Fatalf("after a1 was delivered: %v, want [a2]", got)
		}
		// b1's delivery failed: it is retried later and b2 waits for it.
		if err := o.Release(ctx, "r1", []int64{byID["b1"]}, "broker said no", true, 0, 2); err != nil {
			t.Fatal(err)
		}
		if got := claim("r3"); !slices.Equal(got, []string{"b1"}) {
			t.Fatalf("after b1 was released: %v, want [b1] (b2 still behind it)", got)
		}
		// b1 fails again and is parked: b2 goes on.
		if err := o.Release(ctx, "r3", []int64{byID["b1"]}, "broker said no", true, 0, 2); err != nil {
			t.Fatal(err)
		}
		if got := claim("r3"); !slices.Equal(got, []string{"b2"}) {
			t.Fatalf("after b1 was parked: %v, want [b2]", got)
		}
	})
}

// TestMigrateAddsOrderingKeyToAnOldOutbox: a database migrated before the
// ordering key existed (001 only) gets the column and its index from
// Migrate, which stays idempotent.
func TestMigrateAddsOrderingKeyToAnOldOutbox(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		s, db := b.newStore(t)
		ctx := context.Background()
		table := s.TablePrefix() + "outbox"
		if err := db.Exec("DROP INDEX " + s.TablePrefix() + "outbox_key_idx").Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("ALTER TABLE " + table + " DROP COLUMN ordering_key").Error; err != nil {
			t.Fatal(err)
		}
		if err := s.CheckSchema(ctx); err == nil {
			t.Fatal("CheckSchema passed without the ordering_key column")
		}
		for range 2 {
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CheckSchema(ctx); err != nil {
			t.Fatal(err)
		}
		m := &outbox.Message{MessageID: "k1", Destination: "queue:q", Headers: map[string]string{"BW-OrderingKey": "K"}}
		if err := db.Transaction(func(tx *gorm.DB) error { return s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{m}) }); err != nil {
			t.Fatal(err)
		}
		var key string
		if err := db.Raw("SELECT ordering_key FROM "+table+" WHERE id = ?", m.ID).Scan(&key).Error; err != nil || key != "K" {
			t.Fatalf("ordering_key = %q, %v; want K", key, err)
		}
	})
}
