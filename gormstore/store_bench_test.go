package gormstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// benchStores runs fn on a fresh store on in-memory SQLite and, when
// BAREWIRE_TEST_POSTGRES_DSN is set, on PostgreSQL (own table prefix,
// dropped afterwards).
func benchStores(b *testing.B, fn func(b *testing.B, s *gormstore.Store, db *gorm.DB)) {
	b.Run("sqlite", func(b *testing.B) {
		db, err := gormstore.OpenSQLite("")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { closeBenchDB(b, db) })
		fn(b, migratedForBench(b, db, gormstore.DefaultTablePrefix), db)
	})
	b.Run("postgres", func(b *testing.B) {
		dsn := os.Getenv("BAREWIRE_TEST_POSTGRES_DSN")
		if dsn == "" {
			b.Skip("set BAREWIRE_TEST_POSTGRES_DSN to benchmark on PostgreSQL")
		}
		db, err := postgresdb.Open(dsn)
		if err != nil {
			b.Fatal(err)
		}
		rb := make([]byte, 5)
		_, _ = rand.Read(rb)
		prefix := "bwbench_" + hex.EncodeToString(rb) + "_"
		b.Cleanup(func() {
			db.Exec("DROP TABLE IF EXISTS " + prefix + "inbox, " + prefix + "outbox")
			closeBenchDB(b, db)
		})
		fn(b, migratedForBench(b, db, prefix), db)
	})
}

func migratedForBench(b *testing.B, db *gorm.DB, prefix string) *gormstore.Store {
	b.Helper()
	s, err := gormstore.New(db, gormstore.WithTablePrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() }) // before the database closes: cleanups run last-in first-out
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

func closeBenchDB(b *testing.B, db *gorm.DB) {
	if err := gormstore.Close(db); err != nil { // with an in-memory database's anchor
		b.Error(err)
	}
}

func benchMessage(id string) *outbox.Message {
	return &outbox.Message{
		MessageID: id, Destination: "exchange:OrderPlaced", MessageType: "OrderPlaced", ContentType: "application/json",
		Headers: map[string]string{"tenant": "acme"},
		Payload: []byte(`{"orderId":"o-1","amount":12.5,"pad":"` + strings.Repeat("x", 200) + `"}`),
	}
}

// BenchmarkOutboxAdd is what PublishTx costs the producer's transaction:
// one transaction per op holding one Add of one message.
func BenchmarkOutboxAdd(b *testing.B) {
	benchStores(b, func(b *testing.B, s *gormstore.Store, db *gorm.DB) {
		ctx := context.Background()
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			i++
			err := db.Transaction(func(tx *gorm.DB) error {
				return s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{benchMessage("add-" + strconv.Itoa(i))})
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkOutboxClaimMark is the relay's database work per batch of 100:
// claim (lease) and mark delivered. ns/op is per message.
func BenchmarkOutboxClaimMark(b *testing.B) {
	benchStores(b, func(b *testing.B, s *gormstore.Store, db *gorm.DB) {
		ctx := context.Background()
		const batch = 100
		// Pre-fill outside the timer, enough rows for every claim.
		fill := func(n int, round int) {
			for done := 0; done < n; done += 1000 {
				msgs := make([]*outbox.Message, 0, 1000)
				for j := done; j < min(done+1000, n); j++ {
					msgs = append(msgs, benchMessage(fmt.Sprintf("cm-%d-%d", round, j)))
				}
				err := db.Transaction(func(tx *gorm.DB) error { return s.Outbox().Add(gormstore.WithTx(ctx, tx), msgs) })
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		round := 0
		b.ReportAllocs()
		for b.Loop() {
			// b.Loop gives one op per iteration: claim one message's share
			// by claiming a batch every batch iterations.
			if round%batch == 0 {
				b.StopTimer()
				fill(batch, round)
				b.StartTimer()
				msgs, err := s.Outbox().Claim(ctx, "bench", batch, 30*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				ids := make([]int64, len(msgs))
				for k, m := range msgs {
					ids[k] = m.ID
				}
				if _, err := s.Outbox().MarkDelivered(ctx, "bench", ids, false); err != nil {
					b.Fatal(err)
				}
			}
			round++
		}
	})
}

// BenchmarkInbox is the inbox's database work per consumed message with an
// empty handler: two-phase (lock transaction, then process transaction)
// against group-committed two-phase (batches of 32) and single-transaction.
func BenchmarkInbox(b *testing.B) {
	benchStores(b, func(b *testing.B, s *gormstore.Store, db *gorm.DB) {
		ctx := context.Background()
		noop := func(context.Context) error { return nil }
		b.Run("TwoPhase", func(b *testing.B) {
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				key := inbox.Key{MessageID: "tp-" + strconv.Itoa(i), ConsumerType: "bench"}
				lock, err := s.Inbox().TryLock(ctx, key, 30*time.Second)
				if err != nil || lock.State != inbox.Acquired {
					b.Fatalf("lock: %v %v", lock.State, err)
				}
				if err := s.Inbox().Process(ctx, key, lock.Token, noop); err != nil {
					b.Fatal(err)
				}
			}
		})
		// LockAndProcess is the middleware's path: on PostgreSQL with the
		// Pipeline plugin (postgresdb.Open) the lock goes with the BEGIN
		// and the mark with the COMMIT; elsewhere it is TwoPhase.
		b.Run("LockAndProcess", func(b *testing.B) {
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				key := inbox.Key{MessageID: "lp-" + strconv.Itoa(i), ConsumerType: "bench"}
				lock, err := s.Inbox().LockAndProcess(ctx, key, 30*time.Second, noop)
				if err != nil || lock.State != inbox.Acquired {
					b.Fatalf("lock and process: %v %v", lock.State, err)
				}
			}
		})
		// A consumer's work as the load tool's e2e does it: a business row
		// and one published message, in the inbox's transaction.
		business := s.TablePrefix() + "bench_business"
		if err := db.Exec("CREATE TABLE " + business + " (id text PRIMARY KEY)").Error; err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + business) })
		work := func(id string) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				tx, _ := gormstore.TxFromContext(ctx)
				if err := tx.Exec("INSERT INTO "+business+" (id) VALUES (?)", id).Error; err != nil {
					return err
				}
				return s.Outbox().Add(ctx, []*outbox.Message{{MessageID: "out-" + id, Destination: "exchange:Bench", MessageType: "Bench", Payload: []byte(`{}`)}})
			}
		}
		b.Run("TwoPhaseConsume", func(b *testing.B) {
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				id := "tpc-" + strconv.Itoa(i)
				key := inbox.Key{MessageID: id, ConsumerType: "bench"}
				lock, err := s.Inbox().TryLock(ctx, key, 30*time.Second)
				if err != nil || lock.State != inbox.Acquired {
					b.Fatalf("lock: %v %v", lock.State, err)
				}
				if err := s.Inbox().Process(ctx, key, lock.Token, work(id)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("LockAndProcessConsume", func(b *testing.B) {
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				id := "lpc-" + strconv.Itoa(i)
				lock, err := s.Inbox().LockAndProcess(ctx, inbox.Key{MessageID: id, ConsumerType: "bench"}, 30*time.Second, work(id))
				if err != nil || lock.State != inbox.Acquired {
					b.Fatalf("lock and process: %v %v", lock.State, err)
				}
			}
		})
		// One op is one message of batches of 32 (group commit): one
		// TryLockBatch and one ProcessBatch per 32 messages.
		b.Run("Batch32", func(b *testing.B) {
			const size = 32
			i := 0
			var ids []string
			b.ReportAllocs()
			for b.Loop() {
				i++
				ids = append(ids, "gc-"+strconv.Itoa(i))
				if len(ids) < size {
					continue
				}
				locks, err := s.Inbox().TryLockBatch(ctx, "bench", ids, 30*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				items := make([]inbox.BatchItem, len(ids))
				for j, id := range ids {
					if locks[j].State != inbox.Acquired {
						b.Fatalf("lock %s: %v", id, locks[j].State)
					}
					items[j] = inbox.BatchItem{MessageID: id, Token: locks[j].Token, Ctx: ctx, Fn: noop}
				}
				for j, err := range s.Inbox().ProcessBatch(ctx, "bench", items, time.Time{}) {
					if err != nil {
						b.Fatalf("process %s: %v", ids[j], err)
					}
				}
				ids = ids[:0]
			}
		})
		b.Run("SingleTransaction", func(b *testing.B) {
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				key := inbox.Key{MessageID: "st-" + strconv.Itoa(i), ConsumerType: "bench"}
				done, err := s.Inbox().ProcessAndLock(ctx, key, noop)
				if err != nil || !done {
					b.Fatalf("process: %v %v", done, err)
				}
			}
		})
	})
}

// BenchmarkOutboxAddConcurrent is the producer side under load: 16
// goroutines, each committing transactions of one business row and one
// Add, as many producers' PublishTx in b.Transaction do. On PostgreSQL,
// what it shows is how well concurrent commits share WAL flushes.
func BenchmarkOutboxAddConcurrent(b *testing.B) {
	benchStores(b, func(b *testing.B, s *gormstore.Store, db *gorm.DB) {
		if s.Dialect() == gormstore.DialectSQLite {
			b.Skip("SQLite runs one transaction at a time")
		}
		ctx := context.Background()
		business := s.TablePrefix() + "bench_business"
		if err := db.Exec("CREATE TABLE " + business + " (id bigserial PRIMARY KEY, ref text NOT NULL)").Error; err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + business) })
		var seq atomic.Int64
		b.SetParallelism(8) // × GOMAXPROCS 2 = 16 producers
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				id := "addc-" + strconv.FormatInt(seq.Add(1), 10)
				err := db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Exec("INSERT INTO "+business+" (ref) VALUES (?)", id).Error; err != nil {
						return err
					}
					return s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{benchMessage(id)})
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
	})
}

// BenchmarkProducerTx is the producer's transaction of the load tool on
// PostgreSQL: a business insert and n messages added. "Transaction" is
// GORM's transaction with each Add inserting at once (BEGIN, insert, n
// outbox inserts, COMMIT); "Begin" is Outbox.Begin, whose Adds wait for
// the commit (BEGIN, insert, one batch of the n-row outbox insert and the
// COMMIT). One op is one transaction.
func BenchmarkProducerTx(b *testing.B) {
	benchStores(b, func(b *testing.B, s *gormstore.Store, db *gorm.DB) {
		if s.Dialect() == gormstore.DialectSQLite {
			b.Skip("Outbox.Begin needs PostgreSQL with postgresdb.Pipeline")
		}
		ctx := context.Background()
		business := s.TablePrefix() + "bench_business"
		if err := db.Exec("CREATE TABLE " + business + " (id bigserial PRIMARY KEY, ref text NOT NULL)").Error; err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + business) })
		var seq atomic.Int64
		work := func(tx *gorm.DB, n int) error {
			id := "ptx-" + strconv.FormatInt(seq.Add(1), 10)
			if err := tx.Exec("INSERT INTO "+business+" (ref) VALUES (?)", id).Error; err != nil {
				return err
			}
			for j := range n {
				if err := s.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{benchMessage(id + "-" + strconv.Itoa(j))}); err != nil {
					return err
				}
			}
			return nil
		}
		for _, n := range []int{1, 4} {
			b.Run(fmt.Sprintf("Transaction/%d", n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := db.Transaction(func(tx *gorm.DB) error { return work(tx, n) }); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("Begin/%d", n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					tx, err := s.Outbox().Begin(ctx, db)
					if err != nil || tx == nil {
						b.Fatalf("Begin: %v, %v", tx, err)
					}
					if err := work(tx, n); err != nil {
						b.Fatal(err)
					}
					if err := gormstore.DeferredOf(tx).CommitContext(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	})
}
