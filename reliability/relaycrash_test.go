//go:build linux

package reliability_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// stallAtMark is an outbox store whose MarkDelivered (leased batches) or
// batch Settle (held batches: held is set and the store has ClaimBatch)
// stands for a relay that dies right after the broker confirmed a batch:
// it reports the ids it was asked to mark and then does not mark them until
// the test releases it (a frozen or dead process never would). Released,
// it either marks late, like a relay that was only paused, or fails, like a
// mark whose database round trip failed.
type stallAtMark struct {
	outbox.Store
	held    bool
	reached chan []int64
	release chan struct{}
	fail    bool
	late    chan int // rows the late mark changed (-1: the late settle failed)
}

func newStallAtMark(s outbox.Store, held, fail bool) *stallAtMark {
	return &stallAtMark{Store: s, held: held, reached: make(chan []int64, 1), release: make(chan struct{}), fail: fail, late: make(chan int, 1)}
}

func (s *stallAtMark) MarkDelivered(ctx context.Context, owner string, ids []int64, del bool) (int, error) {
	s.reached <- ids
	<-s.release
	if s.fail {
		return 0, errors.New("simulated crash between confirm and mark")
	}
	// The relay's own settle context may have timed out by now; the late
	// mark of a paused process reaches the database all the same.
	n, err := s.Store.MarkDelivered(context.WithoutCancel(ctx), owner, ids, del)
	s.late <- n
	return n, err
}

func (s *stallAtMark) ClaimBatch(ctx context.Context, owner string, limit int, hold time.Duration) (outbox.Batch, error) {
	if !s.held {
		return outbox.ClaimLeased(ctx, s, owner, limit, hold)
	}
	b, err := s.Store.(outbox.BatchClaimer).ClaimBatch(ctx, owner, limit, hold)
	if err != nil {
		return nil, err
	}
	return stalledBatch{Batch: b, s: s}, nil
}

type stalledBatch struct {
	outbox.Batch
	s *stallAtMark
}

func (b stalledBatch) Settle(ctx context.Context, st outbox.Settlement) error {
	b.s.reached <- st.Delivered
	<-b.s.release
	if b.s.fail {
		// Nothing recorded: the rows go back at once, as when the
		// connection dies.
		_ = b.Batch.Settle(ctx, outbox.Settlement{})
		return errors.New("simulated crash between confirm and mark")
	}
	err := b.Batch.Settle(context.WithoutCancel(ctx), st)
	if err != nil {
		b.s.late <- -1
	} else {
		b.s.late <- len(st.Delivered)
	}
	return err
}

// TestRelayCrashBetweenConfirmAndMark is issue 4's deterministic fault: the
// broker confirmed an outbox row, the relay that sent it never marked it
// (it froze, or its mark failed), a second relay re-delivers the row once
// the first relay's hold on it ended, and the receiving bus's inbox absorbs
// the repeat: one effect. A late mark from the first relay must not touch
// the row the second relay now owns. Both ways a relay holds a batch: a
// lease (SQLite's, and the PostgreSQL transport's) and row locks in an
// open transaction (PostgreSQL's ClaimBatch), whose frozen holder loses its
// connection after the lease's length.
func TestRelayCrashBetweenConfirmAndMark(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	url := testenv.AMQPURL(t)
	ctx := context.Background()
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeGorm(db) })
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	sfx := hex.EncodeToString(raw[:])
	srcPrefix, busPrefix := "rc_"+sfx+"_src_", "rc_"+sfx+"_bus_"
	effects := "rc_" + sfx + "_effects"
	typ, queue := "RelayCrash-"+sfx, "relay-crash-"+sfx
	t.Cleanup(func() {
		for _, tbl := range []string{srcPrefix + "outbox", srcPrefix + "inbox", busPrefix + "outbox", busPrefix + "inbox", effects} {
			db.Exec(`DROP TABLE IF EXISTS ` + tbl)
		}
		deleteTopology(t, url, []string{queue, queue + "_error"}, []string{typ})
	})
	if err := db.Exec(`CREATE TABLE ` + effects + ` (message_id text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The receiving side: a bus whose endpoint writes one effect row per
	// message through its transaction. Its own outbox (busPrefix) is not
	// the one under test, so its relay stays out of the way.
	b, err := bus.New(
		bus.WithLogger(quiet),
		bus.WithTransport(rabbitmq.New(url, func(c *rabbitmq.Config) {
			c.ReceiveEndpoint(queue, func(e *endpoint.Endpoint) {
				endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
					return bus.TxFromContext(ctx).Exec(`INSERT INTO `+effects+` (message_id) VALUES (?)`, d.MessageID).Error
				}, endpoint.ForTypes(typ))
			})
		})),
		bus.WithDatabase(db),
		bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = busPrefix }),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })

	// The sending side: an outbox of its own, a RabbitMQ transport, and
	// relays driven by hand.
	src, err := gormstore.New(db, gormstore.WithTablePrefix(srcPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tr, err := rabbitmq.New(url, nil).Build(transport.Env{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })

	const lease = 4 * time.Second
	for _, tc := range []struct {
		name string
		// held: the batch is held by row locks (ClaimBatch), not leased.
		held bool
		// fail: the first relay's mark fails; otherwise it stalls, and
		// marks late after the second relay delivered.
		fail bool
	}{
		{"leased/crash before mark", false, false}, {"leased/mark fails", false, true},
		{"held/crash before mark", true, false}, {"held/mark fails", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "relay-crash/" + sfx + "/" + tc.name
			err := db.Transaction(func(tx *gorm.DB) error {
				return src.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{{
					MessageID: id, Destination: "exchange:" + typ, MessageType: typ,
					ContentType: "application/json", Payload: []byte(`{"case":"` + tc.name + `"}`),
				}})
			})
			if err != nil {
				t.Fatal(err)
			}

			stall := newStallAtMark(src.Outbox(), tc.held, tc.fail)
			r1 := &outbox.Relay{Store: stall, Transport: tr, Owner: "relay-1-" + sfx, Lease: lease, Logger: quiet}
			r1Done := make(chan error, 1)
			go func() { _, err := r1.DispatchOnce(ctx); r1Done <- err }()
			var ids []int64
			claimed := time.Now() // a little after the claim: a safe bound
			select {
			case ids = <-stall.reached: // the broker confirmed the row
			case <-time.After(30 * time.Second):
				t.Fatal("the first relay never reached MarkDelivered")
			}
			if len(ids) != 1 {
				t.Fatalf("first relay confirmed %d rows; want 1", len(ids))
			}
			want := "pending leased by relay-1-" + sfx
			if tc.held {
				want = "pending held"
			}
			if st := rowState(t, db, srcPrefix, ids[0]); st != want {
				t.Fatalf("after confirm without mark the row is %q; want %q", st, want)
			}
			waitUntil(t, 20*time.Second, "the first delivery's effect", func() bool { return effectRows(t, db, effects, id) == 1 })
			if tc.fail {
				close(stall.release)
				if err := <-r1Done; err == nil {
					t.Fatal("DispatchOnce hid the failed mark")
				}
			}

			// A second relay finds nothing while the first one's lease
			// holds, then re-delivers the row once it expired (a held
			// batch whose mark failed was rolled back: at once).
			dupsBefore := b.Stats().Duplicates
			var r2Store outbox.Store = src.Outbox()
			if !tc.held {
				r2Store = leasedStore{src.Outbox()}
			}
			r2 := &outbox.Relay{Store: r2Store, Transport: tr, Owner: "relay-2-" + sfx, Lease: lease, Logger: quiet}
			if !(tc.held && tc.fail) && time.Since(claimed) < lease/2 {
				if n, err := r2.DispatchOnce(ctx); err != nil || n != 0 {
					t.Fatalf("second relay claimed %d rows (err %v) under a live lease; want 0", n, err)
				}
			}
			waitUntil(t, 10*lease, "the second relay's re-delivery", func() bool {
				n, err := r2.DispatchOnce(ctx)
				if err != nil {
					t.Logf("second relay: %v", err)
				}
				return n == 1 && err == nil
			})
			if st := rowState(t, db, srcPrefix, ids[0]); st != "delivered" {
				t.Fatalf("after the re-delivery the row is %q; want delivered", st)
			}
			waitUntil(t, 20*time.Second, "the inbox to absorb the repeat", func() bool { return b.Stats().Duplicates > dupsBefore })
			if n := effectRows(t, db, effects, id); n != 1 {
				t.Fatalf("%d effect rows for %s; want exactly 1", n, id)
			}

			if !tc.fail {
				// The first relay wakes up and marks late: the row is no
				// longer leased to it, so its mark must change nothing.
				close(stall.release)
				n := <-stall.late
				err := <-r1Done
				if tc.held {
					// Its connection was closed when the hold ran out: the
					// settle fails.
					if n != -1 || err == nil {
						t.Fatalf("the stale relay's late settle: %d, relay error %v; want it failed", n, err)
					}
				} else {
					if n != 0 {
						t.Fatalf("the stale relay's late mark changed %d rows; want 0", n)
					}
					if err != nil {
						t.Fatalf("first relay: %v", err)
					}
				}
				if st := rowState(t, db, srcPrefix, ids[0]); st != "delivered" {
					t.Fatalf("after the stale relay's late mark the row is %q; want delivered", st)
				}
			}
		})
	}
}

func effectRows(t *testing.T, db *gorm.DB, table, id string) int64 {
	t.Helper()
	var n int64
	if err := db.Raw(`SELECT count(*) FROM `+table+` WHERE message_id = ?`, id).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// rowState describes an outbox row: "delivered", "pending leased by X",
// "pending held" (locked by a relay's open transaction) or "pending".
func rowState(t *testing.T, db *gorm.DB, prefix string, id int64) string {
	t.Helper()
	var row struct {
		Status   string
		LockedBy *string
	}
	if err := db.Raw(`SELECT status, locked_by FROM `+prefix+`outbox WHERE id = ?`, id).Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	if row.Status == "pending" && row.LockedBy != nil {
		return "pending leased by " + *row.LockedBy
	}
	if row.Status == "pending" {
		var free int64
		err := db.Transaction(func(tx *gorm.DB) error {
			return tx.Raw(`SELECT count(*) FROM (SELECT id FROM `+prefix+`outbox WHERE id = ? FOR UPDATE SKIP LOCKED) AS f`, id).Scan(&free).Error
		})
		if err != nil {
			t.Fatal(err)
		}
		if free == 0 {
			return "pending held"
		}
	}
	return row.Status
}

// leasedStore hides ClaimBatch: a relay over it leases its batches.
type leasedStore struct{ outbox.Store }

// waitUntil polls cond (database or broker state, which offer no signal)
// until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// closeGorm closes db, including the anchor of an in-memory SQLite
// database (gormstore.Close).
func closeGorm(db *gorm.DB) { _ = gormstore.Close(db) }

// deleteTopology removes test queues and exchanges.
func deleteTopology(t *testing.T, url string, queues, exchanges []string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	for _, q := range queues {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	}
	for _, x := range exchanges {
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(x, false, false)
			_ = ch.Close()
		}
	}
}
