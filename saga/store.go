package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/barewire-go/barewire/internal/batchdel"
)

// Migrate creates (or alters, with GORM's AutoMigrate) the instance table
// of every machine in db. Run it before the bus consumes: with the embedded
// default, after Start and before the first event is published, on the
// bus's DB. Teams that manage their schema with goose or atlas can create
// the tables themselves: see docs/sagas.md for the columns.
func Migrate(ctx context.Context, db *gorm.DB, machines ...Definition) error {
	for _, m := range machines {
		if m == nil {
			return fmt.Errorf("%w: Migrate: a machine is nil", ErrInvalidMachine)
		}
		if err := db.WithContext(ctx).Table(m.Table()).AutoMigrate(m.Model()); err != nil {
			return fmt.Errorf("saga %q: migrate table %q: %w", m.Name(), m.Table(), err)
		}
	}
	return nil
}

// Get returns the instance with correlation id id, or an error wrapping
// ErrNotFound.
func (m *Machine[S]) Get(ctx context.Context, db *gorm.DB, id string) (*S, error) {
	inst := new(S)
	err := db.WithContext(ctx).Table(m.cfg.table).Where("correlation_id = ?", id).Take(inst).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, fmt.Errorf("%w: %q in %q", ErrNotFound, id, m.name)
	}
	if err != nil {
		return nil, fmt.Errorf("saga %q: get %q: %w", m.name, id, err)
	}
	return inst, nil
}

// MaxListLimit is the most instances List returns at once.
const MaxListLimit = 10000

// List returns up to limit (1-10000) instances in state (all states if
// state is empty), least recently updated first: the ones stuck longest
// come first, for operators.
func (m *Machine[S]) List(ctx context.Context, db *gorm.DB, state StateName, limit int) ([]S, error) {
	if limit < 1 || limit > MaxListLimit {
		return nil, fmt.Errorf("saga %q: List limit %d: must be within 1-%d", m.name, limit, MaxListLimit)
	}
	q := db.WithContext(ctx).Table(m.cfg.table)
	if state != "" {
		q = q.Where("current_state = ?", string(state))
	}
	var out []S
	if err := q.Order("updated_at, correlation_id").Limit(limit).Find(&out).Error; err != nil {
		return nil, fmt.Errorf("saga %q: list: %w", m.name, err)
	}
	return out, nil
}

// DeleteFinalized deletes instances kept in Final (KeepFinalized) whose
// last change is older than retention, in batches of batch rows (0: 1000)
// so that no statement holds many locks; it returns how many it deleted.
// Safe to run from several instances at once.
func (m *Machine[S]) DeleteFinalized(ctx context.Context, db *gorm.DB, retention time.Duration, batch int) (int, error) {
	if retention < 0 {
		return 0, fmt.Errorf("saga %q: DeleteFinalized retention %v is negative", m.name, retention)
	}
	if batch < 0 || batch > MaxListLimit {
		return 0, fmt.Errorf("saga %q: DeleteFinalized batch %d: must be within 0-%d", m.name, batch, MaxListLimit)
	}
	return batchdel.Once(ctx, batch, m.deleteFinalized(db, retention))
}

// deleteFinalized deletes one batch of finalized instances older than
// retention. On PostgreSQL the batch skips rows another process is
// deleting (FOR UPDATE SKIP LOCKED) instead of waiting on them, so several
// cleaners share the work; SQLite's single writer serializes them.
func (m *Machine[S]) deleteFinalized(db *gorm.DB, retention time.Duration) batchdel.Func {
	return func(ctx context.Context, n int) (int, error) {
		// UTC: SQLite compares the timestamps as text (see State).
		cutoff := time.Now().UTC().Add(-retention)
		sub := db.Table(m.cfg.table).Select("correlation_id").
			Where("current_state = ? AND updated_at < ?", string(Final), cutoff).Limit(n)
		if db.Dialector != nil && db.Dialector.Name() == "postgres" {
			sub = sub.Clauses(clause.Locking{Strength: "UPDATE", Options: "SKIP LOCKED"})
		}
		res := db.WithContext(ctx).Table(m.cfg.table).Where("correlation_id IN (?)", sub).Delete(new(S))
		if res.Error != nil {
			return 0, fmt.Errorf("saga %q: delete finalized: %w", m.name, res.Error)
		}
		return int(res.RowsAffected), nil
	}
}

// RunCleanup deletes, every interval until ctx is done, the finalized
// instances older than the machine's RetainFinalized period, in batches of
// 1000 until a batch comes back short; failures are logged as warnings
// through log (nil: slog.Default) and retried next interval. The first
// pass runs after one interval. Run it on the bus's database, in a
// goroutine of every process or of one: several at once share the work.
// It returns at once with an error if the machine has no RetainFinalized
// period or interval is not positive, and nil when ctx is done.
func (m *Machine[S]) RunCleanup(ctx context.Context, db *gorm.DB, interval time.Duration, log *slog.Logger) error {
	switch {
	case m.cfg.retention == 0:
		return fmt.Errorf("saga %q: RunCleanup: the machine has no retention period; build it with saga.RetainFinalized(period)", m.name)
	case interval <= 0:
		return fmt.Errorf("saga %q: RunCleanup interval %v: must be positive", m.name, interval)
	case db == nil:
		return fmt.Errorf("saga %q: RunCleanup: db is nil; pass the bus's database (b.DB() after Start)", m.name)
	}
	if log == nil {
		log = slog.Default()
	}
	batchdel.Loop(ctx, interval, 0, m.deleteFinalized(db, m.cfg.retention), log.With("saga", m.name), "saga cleanup", nil)
	return nil
}

// Inspector is a machine seen by tooling (the admin API) whatever its
// instance type; *Machine[S] implements it. Instances are returned as *S,
// to be encoded as JSON.
type Inspector interface {
	Definition
	// CountByState counts the instances in each state.
	CountByState(ctx context.Context, db *gorm.DB) (map[StateName]int64, error)
	// ListInstances is List with the instances as *S.
	ListInstances(ctx context.Context, db *gorm.DB, state StateName, limit int) ([]any, error)
	// GetInstance is Get with the instance as *S.
	GetInstance(ctx context.Context, db *gorm.DB, id string) (any, error)
}

var _ Inspector = (*Machine[struct{ State }])(nil)

// CountByState counts the instances in each state (states without
// instances are absent).
func (m *Machine[S]) CountByState(ctx context.Context, db *gorm.DB) (map[StateName]int64, error) {
	var rows []struct {
		CurrentState string
		N            int64
	}
	if err := db.WithContext(ctx).Table(m.cfg.table).Select("current_state, COUNT(*) AS n").Group("current_state").Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("saga %q: count by state: %w", m.name, err)
	}
	out := make(map[StateName]int64, len(rows))
	for _, r := range rows {
		out[StateName(r.CurrentState)] = r.N
	}
	return out, nil
}

// ListInstances implements Inspector.
func (m *Machine[S]) ListInstances(ctx context.Context, db *gorm.DB, state StateName, limit int) ([]any, error) {
	l, err := m.List(ctx, db, state, limit)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(l))
	for i := range l {
		out[i] = &l[i]
	}
	return out, nil
}

// GetInstance implements Inspector.
func (m *Machine[S]) GetInstance(ctx context.Context, db *gorm.DB, id string) (any, error) {
	return m.Get(ctx, db, id)
}
