package gormstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/outbox"
)

// A consumer handles a message exactly once and publishes a follow-up
// message in the same transaction.
func Example() {
	ctx := context.Background()
	db, err := gormstore.OpenSQLite("") // postgresdb.Open(dsn) in production
	if err != nil {
		log.Fatal(err)
	}
	defer gormstore.Close(db)

	store, err := gormstore.New(db)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	in, out := store.Inbox(), store.Outbox()

	handle := func(messageID string) {
		key := inbox.Key{MessageID: messageID, ConsumerType: "billing"}
		lock, err := in.TryLock(ctx, key, 30*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		if lock.State != inbox.Acquired {
			fmt.Println(messageID, "skipped:", lock.State) // processed: ack; busy: requeue
			return
		}
		err = in.Process(ctx, key, lock.Token, func(ctx context.Context) error {
			tx, _ := gormstore.TxFromContext(ctx) // business writes go through tx
			_ = tx
			return out.Add(ctx, []*outbox.Message{{
				MessageID:   "invoice-for-" + messageID,
				Destination: "exchange:invoices",
				Payload:     []byte(`{"order":"` + messageID + `"}`),
			}})
		})
		if err != nil {
			_ = in.Release(ctx, key, lock.Token)
			log.Fatal(err)
		}
		fmt.Println(messageID, "processed")
	}
	handle("order-1")
	handle("order-1") // a redelivery

	// The relay side.
	msgs, err := out.Claim(ctx, "relay-1", 10, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range msgs {
		fmt.Println("relay", m.MessageID, "to", m.Destination)
	}
	// Output:
	// order-1 processed
	// order-1 skipped: processed
	// relay invoice-for-order-1 to exchange:invoices
}
