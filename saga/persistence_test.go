package saga_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/saga"
	"github.com/barewire-go/barewire/transport/inproc"
)

type ParcelLine struct {
	SKU string
	Qty int
}

type ParcelMeta struct {
	Carrier string
	Tags    []string
	Weights map[string]float64
}

// Parcel keeps its data three ways: plain columns of the GORM model, a
// GORM serializer:json field, and a saga.JSON column.
type Parcel struct {
	saga.State
	Carrier   string `gorm:"size:50;index"`
	Weight    float64
	Insured   bool
	Count     int64
	DueAt     time.Time
	Note      *string
	Lines     []ParcelLine `gorm:"serializer:json"`
	Meta      saga.JSON[ParcelMeta]
	Scratch   string `gorm:"-"` // not stored
	Secondary saga.JSON[[]string]
}

type ParcelOpened struct {
	ID, Carrier string
	DueAt       time.Time
}
type ParcelLineAdded struct {
	ID, SKU string
	Qty     int
	Weight  float64
}

// TestInstanceData: the instance's data, as the user's own GORM model with
// columns of several types, a serializer:json field and saga.JSON columns,
// survives transitions on SQLite and PostgreSQL; on PostgreSQL saga.JSON is
// a jsonb column that SQL can query.
func TestInstanceData(t *testing.T) {
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			s := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
			table, prefix := "saga_parcel_"+s, "sagap_"+s+"_"
			m, err := saga.New("parcels", func(m *saga.Machine[Parcel]) {
				packing := m.State("Packing")
				opened := saga.NewEvent(m, func(e ParcelOpened) string { return e.ID })
				added := saga.NewEvent(m, func(e ParcelLineAdded) string { return e.ID })
				m.Initially(saga.When(opened).Then(func(ctx context.Context, c *saga.Context[Parcel, ParcelOpened]) error {
					p := c.Instance
					p.Carrier, p.DueAt, p.Scratch = c.Message.Carrier, c.Message.DueAt, "scratch"
					p.Meta.Data = ParcelMeta{Carrier: c.Message.Carrier, Weights: map[string]float64{}}
					return nil
				}).TransitionTo(packing))
				m.During(packing, saga.When(added).Then(func(ctx context.Context, c *saga.Context[Parcel, ParcelLineAdded]) error {
					p := c.Instance
					if p.Scratch != "" {
						t.Errorf("a gorm:\"-\" field came back from the database: %q", p.Scratch)
					}
					p.Lines = append(p.Lines, ParcelLine{SKU: c.Message.SKU, Qty: c.Message.Qty})
					p.Weight += c.Message.Weight
					p.Insured = p.Weight > 2
					p.Count++
					note := "last: " + c.Message.SKU
					p.Note = &note
					p.Meta.Data.Tags = append(p.Meta.Data.Tags, c.Message.SKU)
					p.Meta.Data.Weights[c.Message.SKU] = c.Message.Weight
					p.Secondary.Data = append(p.Secondary.Data, c.Message.SKU)
					return nil
				}))
			}, saga.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			opts := []bus.Option{quiet(), bus.WithTransport(inproc.New(func(c *inproc.Config) {
				c.ReceiveEndpoint("parcels", func(e *endpoint.Endpoint) {
					saga.Register(e, m)
					e.ConcurrentMessageLimit, e.PrefetchCount = 1, 1 // in order
				})
			}))}
			var db *gorm.DB
			if backend == "postgres" {
				db, err = postgresdb.Open(testenv.PostgresDSN(t))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					for _, tbl := range []string{table, prefix + "inbox", prefix + "outbox"} {
						db.Exec(`DROP TABLE IF EXISTS "` + tbl + `"`)
					}
					if sqlDB, err := db.DB(); err == nil {
						_ = sqlDB.Close()
					}
				})
				opts = append(opts, bus.WithDatabase(db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = prefix }))
			}
			b, err := bus.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Stop(context.Background()) })
			db = b.DB()
			if err := saga.Migrate(ctx, db, m); err != nil {
				t.Fatal(err)
			}
			if err := saga.Migrate(ctx, db, m); err != nil { // idempotent
				t.Fatalf("second Migrate: %v", err)
			}
			due := time.Date(2026, 12, 24, 9, 30, 0, 0, time.UTC)
			if err := b.Publish(ctx, ParcelOpened{ID: "p1", Carrier: "dhl", DueAt: due}, nil); err != nil {
				t.Fatal(err)
			}
			for _, l := range []ParcelLineAdded{{"p1", "apple", 3, 1.5}, {"p1", "pear", 1, 0.75}} {
				if err := b.Publish(ctx, l, nil); err != nil {
					t.Fatal(err)
				}
			}
			settled(t, 3, b)
			got, err := m.Get(ctx, db, "p1")
			if err != nil {
				t.Fatal(err)
			}
			note := "last: pear"
			want := Parcel{
				Carrier: "dhl", Weight: 2.25, Insured: true, Count: 2, Note: &note,
				Lines:     []ParcelLine{{"apple", 3}, {"pear", 1}},
				Meta:      saga.JSON[ParcelMeta]{Data: ParcelMeta{Carrier: "dhl", Tags: []string{"apple", "pear"}, Weights: map[string]float64{"apple": 1.5, "pear": 0.75}}},
				Secondary: saga.JSON[[]string]{Data: []string{"apple", "pear"}},
			}
			if !got.DueAt.Equal(due) {
				t.Errorf("DueAt %v, want %v", got.DueAt, due)
			}
			if got.Version != 3 || got.CurrentState != "Packing" {
				t.Errorf("version %d state %s, want 3 Packing", got.Version, got.CurrentState)
			}
			got.State, got.DueAt = saga.State{}, time.Time{}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("instance data after 3 transitions:\n got %+v\nwant %+v", *got, want)
			}
			// saga.JSON encodes as its value (what the admin API shows).
			if j, err := json.Marshal(got.Secondary); err != nil || string(j) != `["apple","pear"]` {
				t.Errorf("JSON encoding %s, %v", j, err)
			}
			if backend == "postgres" {
				var typ string
				if err := db.Raw(`SELECT data_type FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ? AND column_name = 'meta'`, table).Scan(&typ).Error; err != nil || typ != "jsonb" {
					t.Errorf("meta column type %q (%v), want jsonb", typ, err)
				}
				var n int64
				if err := db.Table(table).Where(`meta->'Weights'->>'pear' = ?`, "0.75").Count(&n).Error; err != nil || n != 1 {
					t.Errorf("jsonb query: %d rows, %v", n, err)
				}
			}
		})
	}
}

// TestJSONScanErrors: a column that is not JSON text fails with a clear error.
func TestJSONScanErrors(t *testing.T) {
	var j saga.JSON[ParcelMeta]
	if err := j.Scan(42); err == nil || !strings.Contains(err.Error(), "cannot scan a int") {
		t.Errorf("Scan(42): %v", err)
	}
	if err := j.Scan("{not json"); err == nil || !strings.Contains(err.Error(), "decode") {
		t.Errorf("Scan(bad JSON): %v", err)
	}
	j.Data.Carrier = "x"
	if err := j.Scan(nil); err != nil || j.Data.Carrier != "" {
		t.Errorf("Scan(nil): %v, %+v", err, j.Data)
	}
}
