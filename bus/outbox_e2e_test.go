package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// TestOutboxScaleThreeRelays writes 100,000 messages from 8 concurrent
// writers, rolls half of the transactions back on purpose, and relays with
// three bus instances on one database: exactly the committed messages must
// reach the broker, each at least once.
func TestOutboxScaleThreeRelays(t *testing.T) {
	env := newRealEnv(t)
	total, perTx, writers := 100_000, 10, 8
	if testing.Short() {
		total = 9_600 // an even number of transactions per writer, so half commit
	}
	q := env.q("outbox-scale")
	ch, err := env.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(2000, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	arrived := make(chan struct{}) // closed when every committed message (total/2) was seen
	go func() {
		for d := range deliveries {
			mu.Lock()
			seen[d.MessageId]++
			if seen[d.MessageId] == 1 && len(seen) == total/2 {
				close(arrived)
			}
			mu.Unlock()
		}
	}()

	var buses []*bus.Bus
	for i := 0; i < 3; i++ {
		buses = append(buses, start(t, env.options(func(*endpoint.Endpoints) {}, func(o *outbox.Options) {
			o.DispatchBatchSize = 500
		})...))
	}
	ctx := context.Background()
	committed := make([][]string, writers)
	errRollback := errors.New("rolled back on purpose")
	var wg sync.WaitGroup
	began := time.Now()
	for w := 0; w < writers; w++ {
		wg.Go(func() {
			b := buses[w%len(buses)]
			for tx := 0; tx < total/perTx/writers; tx++ {
				rollback := tx%2 == 1
				var ids []string
				err := b.Transaction(ctx, func(gtx *gorm.DB) error {
					for m := 0; m < perTx; m++ {
						id := fmt.Sprintf("w%d-t%d-m%d", w, tx, m)
						if err := b.SendTx(ctx, gtx, "queue:"+q, bus.Raw{Type: "Scale", Body: []byte(id)}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
							return err
						}
						ids = append(ids, id)
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				switch {
				case rollback && errors.Is(err, errRollback):
				case err != nil:
					t.Errorf("writer %d: %v", w, err)
					return
				default:
					committed[w] = append(committed[w], ids...)
				}
			}
		})
	}
	wg.Wait()
	wrote := time.Since(began)
	want := map[string]bool{}
	for _, ids := range committed {
		for _, id := range ids {
			want[id] = true
		}
	}
	if len(want) != total/2 {
		t.Fatalf("%d committed messages; want %d", len(want), total/2)
	}
	select {
	case <-arrived:
	case <-time.After(3 * time.Minute):
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		t.Fatalf("only %d of %d committed messages arrived", n, len(want))
	}
	drained := time.Since(began)
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for id, n := range seen {
		if !want[id] {
			t.Fatalf("message %s arrived but its transaction rolled back", id)
		}
		dups += n - 1
	}
	// A message can arrive before its relay marks the row delivered.
	var st outbox.Stats
	waitFor(t, func() bool {
		var err error
		st, err = buses[0].OutboxStore().Stats(ctx)
		return err == nil && st.Pending == 0
	})
	if st.Pending != 0 || st.Parked != 0 || deliveredRows(t, buses[0].OutboxStore()) != int64(len(want)) {
		t.Fatalf("outbox after drain: %+v; want %d delivered and nothing else", st, len(want))
	}
	t.Logf("%d messages in %d transactions by %d writers (half rolled back) written in %v; %d committed delivered by 3 relays in %v total; %d duplicates at the broker",
		total, total/perTx, writers, wrote.Round(time.Millisecond), len(want), drained.Round(time.Millisecond), dups)
}
