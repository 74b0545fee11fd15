package pgtransport_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// These tests characterize watermill-sql v4.1.2's own queue adapters
// (PostgreSQLQueueSchema + PostgreSQLQueueOffsetsAdapter{DeleteOnAck:
// true}) driven by its Subscriber: the behaviour that made this package
// drive its own claim loop (docs/transports.md, "Why not watermill-sql's
// Subscriber"). If one starts failing after a watermill-sql upgrade, the
// library changed: re-read that section.

type stock struct {
	sub   *wsql.Subscriber
	pub   *wsql.Publisher
	table string
	e     *env
}

func newStock(t *testing.T, batch int) *stock {
	t.Helper()
	e := newEnv(t)
	sqlDB, err := e.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	table := e.prefix + "wm_stock"
	name := func(string) string { return `"` + table + `"` }
	schema := wsql.PostgreSQLQueueSchema{
		GeneratePayloadType:       func(string) string { return "BYTEA" },
		GenerateMessagesTableName: name,
		SubscribeBatchSize:        batch,
	}
	db := wsql.BeginnerFromStdSQL(sqlDB)
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:  schema,
		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true, GenerateMessagesTableName: name},
		PollInterval:   20 * time.Millisecond, ResendInterval: 20 * time.Millisecond,
		InitializeSchema: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Close()
		_ = pub.Close()
		e.db.Exec(`DROP TABLE IF EXISTS ` + table)
	})
	return &stock{sub: sub, pub: pub, table: table, e: e}
}

func (s *stock) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := s.e.db.Raw(`SELECT count(*) FROM ` + s.table).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *stock) publish(t *testing.T, n int) {
	t.Helper()
	for range n {
		if err := s.pub.Publish("stock", message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPostgresWatermillStockQueueAdapterMidBatchCloseDeletesUndeliveredRows(t *testing.T) {
	t.Parallel()
	s := newStock(t, 10)
	s.publish(t, 5)
	ch, err := s.sub.Subscribe(t.Context(), "stock")
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ch).Ack()
	_ = recv(t, ch) // in a handler when the subscriber closes
	if err := s.sub.Close(); err != nil {
		t.Fatal(err)
	}
	// One message was acked; four were never acked (one in flight, three
	// never handed out). The ack query deletes every row of the batch.
	if n := s.rows(t); n != 0 {
		t.Fatalf("%d rows left: watermill-sql no longer acks undelivered rows of a batch on close", n)
	}
}

func TestPostgresWatermillStockQueueAdapterNackBlocksCompetingConsumers(t *testing.T) {
	t.Parallel()
	s := newStock(t, 1)
	s.publish(t, 3)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first, err := s.sub.Subscribe(ctx, "stock")
	if err != nil {
		t.Fatal(err)
	}
	m := recv(t, first)
	m.Nack()
	// The nacked message goes back to the same consumer (in process, its
	// row lock and transaction held), and a competing consumer waits on
	// that lock (FOR UPDATE without SKIP LOCKED): nothing else moves.
	second, err := s.sub.Subscribe(ctx, "stock")
	if err != nil {
		t.Fatal(err)
	}
	again := recv(t, first)
	if again.UUID != m.UUID {
		t.Fatalf("after a nack the same consumer got %s, not the nacked %s", again.UUID, m.UUID)
	}
	select {
	case other := <-second:
		t.Fatalf("a competing consumer got %s while a message was nacked: watermill-sql no longer blocks the topic", other.UUID)
	case <-time.After(time.Second):
	}
	again.Ack()
	// Once it is acked, the rest flows again (to either consumer).
	for range 2 {
		select {
		case m := <-first:
			m.Ack()
		case m := <-second:
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatal("the remaining messages did not flow after the ack")
		}
	}
}

func TestPostgresWatermillStockQueueAdapterRejectsLongIDs(t *testing.T) {
	t.Parallel()
	s := newStock(t, 1)
	err := s.pub.Publish("stock", message.NewMessage("order:"+strings.Repeat("x", 40), []byte("x")))
	if err == nil || !strings.Contains(err.Error(), "character varying(36)") {
		t.Fatalf("publishing a 46-character id: %v; want the VARCHAR(36) error", err)
	}
}
