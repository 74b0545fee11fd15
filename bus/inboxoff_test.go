package bus_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
)

// TestInboxOffOnPostgres: a consumer without the inbox (InboxOff) runs in
// a transaction of Outbox.Begin on PostgreSQL with the pipeline plugin
// (its BEGIN rides on the consumer's first statement, its published rows
// on the COMMIT), with the guarantees of a plain transaction: its write
// and its publish commit together; a consumer that fails after both
// leaves neither, is retried and dead-lettered; one that ignores a failed
// statement is charged ErrTransactionAborted. A message without an id on
// an endpoint that processes it (ProcessMissingID) runs the same way.
func TestInboxOffOnPostgres(t *testing.T) {
	t.Parallel()
	env := newPgEnv(t)
	effects := env.prefix + "off_effects"
	if err := env.db.Exec("CREATE TABLE " + effects + " (message_id text NOT NULL, consumer text NOT NULL)").Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.db.Exec("DROP TABLE IF EXISTS " + effects) })
	dls := newDeadLetters()
	audited := make(chan string, 16)
	var deferred, plain, failing atomic.Int32
	write := func(ctx context.Context, id, consumer string) error {
		tx := bus.TxFromContext(ctx)
		if gormstore.DeferredOf(tx) != nil {
			deferred.Add(1)
		} else {
			plain.Add(1)
		}
		return tx.Exec("INSERT INTO "+effects+" (message_id, consumer) VALUES (?, ?)", id, consumer).Error
	}
	b := start(t, append(pgOutbox(env, env.db), quiet(), inprocEndpoints(func(c *endpoint.Endpoints) {
		c.ReceiveEndpoint("off", func(e *endpoint.Endpoint) {
			e.Inbox = endpoint.InboxOff
			e.Retry = endpoint.Immediate(1)
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderPlaced]) error {
				if err := write(ctx, c.Message.OrderID, "off"); err != nil {
					return err
				}
				if err := c.Publish(ctx, OrderAudited{OrderID: c.Message.OrderID}, nil); err != nil {
					return err
				}
				switch c.Message.OrderID {
				case "fails":
					failing.Add(1)
					return errors.New("fails after its write and its publish")
				case "ignores":
					_ = bus.TxFromContext(ctx).Exec("SELECT 1/0").Error // failed and ignored
				}
				return nil
			})
		})
		c.ReceiveEndpoint("off-audit", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, func(ctx context.Context, c *endpoint.Context[OrderAudited]) error {
				audited <- c.Message.OrderID
				return nil
			})
		})
		c.ReceiveEndpoint("off_error", dls.consumer)
		c.ReceiveEndpoint("noid", func(e *endpoint.Endpoint) {
			e.MissingMessageID = endpoint.ProcessMissingID
			endpoint.RawConsumer(e, func(ctx context.Context, d *endpoint.Delivery) error {
				return write(ctx, "noid", "noid")
			})
		})
	}))...)
	ctx := context.Background()
	if err := bus.DeliverRawForTest(b, "noid", []byte(`{}`)); err != nil { // only a raw publisher omits the id
		t.Fatal(err)
	}
	for _, id := range []string{"ok", "fails", "ignores"} {
		if err := b.Publish(ctx, OrderPlaced{OrderID: id}, bus.Headers{bus.HeaderMessageID: "off-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	reasons := map[string]string{}
	for range 2 {
		dl := dls.next(t, 15*time.Second, "failing consumers")
		reasons[strings.TrimPrefix(dl.MessageID, "off-")] = dl.Headers[bus.HeaderFaultReason]
	}
	if r := reasons["fails"]; !strings.Contains(r, "fails after its write") {
		t.Errorf("fails: dead-letter reason %q", r)
	}
	if r := reasons["ignores"]; !strings.Contains(r, "error was ignored") {
		t.Errorf("ignores: dead-letter reason %q, want the aborted-transaction reason", r)
	}
	select {
	case id := <-audited:
		if id != "ok" {
			t.Fatalf("audited %q: a rolled-back consumer's publish went out", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the committed consumer's publish was not delivered")
	}
	drain(t, b)
	select {
	case id := <-audited:
		t.Fatalf("audited %q as well: a rolled-back consumer's publish went out", id)
	default:
	}
	var got []string
	if err := env.db.Raw("SELECT message_id FROM " + effects + " ORDER BY message_id").Scan(&got).Error; err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "noid,ok" {
		t.Errorf("effects %v, want only noid's and ok's", got)
	}
	if failing.Load() != 2 {
		t.Errorf("the failing consumer ran %d times, want 2 (one retry)", failing.Load())
	}
	if deferred.Load() != 6 || plain.Load() != 0 {
		t.Errorf("%d runs in a deferred transaction, %d in a plain one; want 6 (the message without id's too) and 0", deferred.Load(), plain.Load())
	}
}
