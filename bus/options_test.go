package bus_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport/inproc"
	"github.com/barewire-go/barewire/transport/rabbitmq"
)

// PublishThroughOutbox: a Publish outside a transaction leaves an outbox row
// (delivered), instead of going straight to the transport.
func TestPublishThroughOutboxWritesAnOutboxRow(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(),
		bus.WithOutbox(func(o *outbox.Options) { o.PublishThroughOutbox = true }),
		inprocEndpoint("through-outbox", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("through-outbox", rec))
		}))
	if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 1)
	drain(t, b)
	st, err := b.OutboxStore().Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if deliveredRows(t, b.OutboxStore()) != 1 {
		t.Fatalf("outbox %+v; want the publish recorded as one delivered row", st)
	}
}

// DeleteOnDeliver: confirmed rows are deleted rather than kept for retention.
func TestDeleteOnDeliverLeavesNoRows(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := start(t, quiet(),
		bus.WithOutbox(func(o *outbox.Options) { o.PublishThroughOutbox = true; o.DeleteOnDeliver = true }),
		inprocEndpoint("delete-on-deliver", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("delete-on-deliver", rec))
		}))
	if err := b.Publish(context.Background(), PaymentReceived{PaymentID: "p"}, nil); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 1)
	drain(t, b)
	st, err := b.OutboxStore().Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if deliveredRows(t, b.OutboxStore()) != 0 || st.Pending != 0 || st.Parked != 0 {
		t.Fatalf("outbox %+v; want no rows left after delivery", st)
	}
}

// WithSQLite keeps the tables in a file: a bus started again on the same
// file still knows what its inbox processed, so a re-published id is
// absorbed (with the in-memory default it would be handled again).
func TestWithSQLiteFileKeepsTheInboxAcrossRestarts(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "barewire.db")
	run := func(ids ...string) []seen {
		rec := newRecorder()
		b, err := bus.New(quiet(), bus.WithSQLite(path), inprocEndpoint("sqlite-file", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("sqlite-file", rec))
		}))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if err := b.Publish(ctx, PaymentReceived{PaymentID: id}, bus.Headers{bus.HeaderMessageID: id}); err != nil {
				t.Fatal(err)
			}
		}
		rec.wait(t, 1)
		drain(t, b)
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		return rec.snapshot()
	}
	if got := run("persist-1"); len(got) != 1 || got[0].MessageID != "persist-1" {
		t.Fatalf("first run handled %+v", got)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("database file: %v %v", fi, err)
	}
	got := run("persist-1", "persist-2")
	if len(got) != 1 || got[0].MessageID != "persist-2" {
		t.Fatalf("second run handled %+v; want only persist-2 (persist-1 is in the file's inbox)", got)
	}
}

// deleteCapture records how many rows each cleanup DELETE removed, per table.
type deleteCapture struct {
	logger.Interface
	mu   sync.Mutex
	rows map[string][]int64
}

func (c *deleteCapture) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, n := fc()
	for _, table := range []string{"barewire_outbox", "barewire_inbox"} {
		if strings.HasPrefix(sql, "DELETE FROM "+table+" WHERE") && strings.Contains(sql, "LIMIT") {
			c.mu.Lock()
			c.rows[table] = append(c.rows[table], n)
			c.mu.Unlock()
		}
	}
}

func (c *deleteCapture) snapshot(table string) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.rows[table])
}

// CleanupBatchSize bounds every retention DELETE: 10 expired rows in each
// table go in batches of 3, 3, 3, 1.
func TestCleanupBatchSizeBoundsEachDelete(t *testing.T) {
	t.Parallel()
	db, err := gormstore.OpenSQLite("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(db) })
	capture := &deleteCapture{Interface: logger.Discard, rows: map[string][]int64{}}
	rec := newRecorder()
	b := start(t, quiet(),
		bus.WithDatabase(db.Session(&gorm.Session{Logger: capture})),
		bus.WithOutbox(func(o *outbox.Options) {
			o.CleanupBatchSize = 3
			// The first pass runs after one interval, when all 10 rows
			// are past their retention.
			o.CleanupInterval = 1500 * time.Millisecond
			o.OutboxRetention = time.Millisecond
			o.InboxLockTimeout = 100 * time.Millisecond
			o.InboxRetention = 200 * time.Millisecond
		}),
		inprocEndpoint("cleanup-batches", func(e *endpoint.Endpoint) {
			endpoint.Consumer(e, paymentConsumer("cleanup-batches", rec))
		}))
	err = b.Transaction(context.Background(), func(tx *gorm.DB) error {
		for i := range 10 {
			if err := b.PublishTx(context.Background(), tx, PaymentReceived{PaymentID: strconv.Itoa(i)}, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 10)
	for _, table := range []string{"barewire_outbox", "barewire_inbox"} {
		waitFor(t, func() bool {
			var sum int64
			for _, n := range capture.snapshot(table) {
				sum += n
			}
			return sum == 10
		})
		got := capture.snapshot(table)
		if len(got) < 4 || slices.Max(got) != 3 {
			t.Errorf("%s: deletes removed %v rows; want batches of at most 3 (3, 3, 3, 1)", table, got)
		}
	}
}

// TestRelayLeaseMustExceedPublishTimeout: a relay lease not at least twice
// the publish timeout lets a slow confirm outlive the lease, so another
// relay sends the batch a second time; bus.New refuses it, naming both.
func TestRelayLeaseMustExceedPublishTimeout(t *testing.T) {
	t.Parallel()
	newBus := func(lease, pt time.Duration) error {
		_, err := bus.New(quiet(),
			bus.WithTransport(rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/", func(c *rabbitmq.Config) { c.PublishTimeout = pt })),
			bus.WithOutbox(func(o *outbox.Options) { o.RelayLease = lease }))
		return err
	}
	for _, tc := range []struct {
		lease, pt time.Duration
		ok        bool
	}{
		{30 * time.Second, 30 * time.Second, false}, // equal: the case the issue names
		{30 * time.Second, 20 * time.Second, false},
		{30 * time.Second, 15 * time.Second, true},
		{0, 0, true},                // defaults: 1m lease, 30s timeout
		{3 * time.Second, 0, true},  // an unset timeout follows a short lease
		{0, 30 * time.Second, true}, // explicit timeout, default lease
		{0, 45 * time.Second, false},
	} {
		err := newBus(tc.lease, tc.pt)
		switch {
		case tc.ok && err != nil:
			t.Errorf("lease %v, publish timeout %v: %v", tc.lease, tc.pt, err)
		case !tc.ok && (!errors.Is(err, bus.ErrInvalidOption) || !strings.Contains(err.Error(), "RelayLease") || !strings.Contains(err.Error(), "PublishTimeout")):
			t.Errorf("lease %v, publish timeout %v: %v; want ErrInvalidOption naming RelayLease and PublishTimeout", tc.lease, tc.pt, err)
		}
	}
}

// TestTransportAndDatabaseOptionsGivenOnce: a bus has one transport and one
// database; WithTransport or WithDatabase given twice, or given nil (a nil
// interface or a typed nil pointer), and WithOutbox given a nil configure
// are refused with ErrInvalidOption naming the option.
func TestTransportAndDatabaseOptionsGivenOnce(t *testing.T) {
	t.Parallel()
	db, err := gormstore.OpenSQLite("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gormstore.Close(db) })
	var nilInproc *inproc.Transport
	var nilRabbit *rabbitmq.Transport
	for _, tc := range []struct {
		name string
		opts []bus.Option
		want string
	}{
		{"WithTransport twice", []bus.Option{bus.WithTransport(inproc.New(nil)), bus.WithTransport(inproc.New(nil))}, "WithTransport given twice"},
		{"WithTransport twice, different transports", []bus.Option{
			bus.WithTransport(rabbitmq.New("amqp://guest:guest@127.0.0.1:5672/", nil)), bus.WithTransport(inproc.New(nil)),
		}, "WithTransport given twice"},
		{"WithTransport nil", []bus.Option{bus.WithTransport(nil)}, "WithTransport: transport is nil"},
		{"WithTransport typed nil inproc", []bus.Option{bus.WithTransport(nilInproc)}, "WithTransport: transport is nil"},
		{"WithTransport typed nil rabbitmq", []bus.Option{bus.WithTransport(nilRabbit)}, "WithTransport: transport is nil"},
		{"WithDatabase twice", []bus.Option{bus.WithDatabase(db), bus.WithDatabase(db)}, "WithDatabase given twice"},
		{"WithDatabase nil", []bus.Option{bus.WithDatabase(nil)}, "WithDatabase: db is nil"},
		{"WithOutbox nil", []bus.Option{bus.WithOutbox(nil)}, "WithOutbox: configure is nil"},
	} {
		_, err := bus.New(append([]bus.Option{quiet()}, tc.opts...)...)
		if !errors.Is(err, bus.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v; want ErrInvalidOption saying %q", tc.name, err, tc.want)
		}
	}
	// Once each is fine, and WithOutbox may be given more than once: each
	// configure runs in turn.
	var seen []int
	_, err = bus.New(quiet(), bus.WithTransport(inproc.New(nil)), bus.WithDatabase(db),
		bus.WithOutbox(func(*outbox.Options) { seen = append(seen, 1) }),
		bus.WithOutbox(func(*outbox.Options) { seen = append(seen, 2) }))
	if err != nil || !slices.Equal(seen, []int{1, 2}) {
		t.Errorf("each option once, WithOutbox twice: New = %v, configures ran %v; want nil and [1 2]", err, seen)
	}
}
