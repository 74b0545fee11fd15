package gormstore

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	gosqlite "github.com/glebarez/go-sqlite"
)

// WithClock makes the store's statements read "now" from the Go function
// now instead of the database's clock. It is for tests (package bustest
// uses it for its fake clock); production keeps the database clock, the one
// clock every instance shares. SQLite only: New rejects it on PostgreSQL.
//
// Every decision the store makes in SQL (lock expiry, lease expiry,
// retention, retry delays) then reads the same clock, so moving it forward
// moves all of them together; the lock token still guards the processed
// mark, so a delivery whose lock was taken over cannot commit. Column
// defaults (created_at and available_at of a new outbox row) keep the
// database clock: a clock that never runs behind the real one (bustest's
// only moves forward from it) leaves those rows due at once.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// clockFunc is the SQLite function a store with a clock reads "now" from:
// barewire_clock(id) returns the time of the clock registered under id.
// The id is a literal written into the statements when the store is built,
// so the statements keep their bind parameters unchanged.
const clockFunc = "barewire_clock"

var (
	clocks   sync.Map // int64 → func() time.Time
	clockSeq atomic.Int64
)

func init() {
	// Registered once, before any connection opens: the driver installs its
	// functions on every new connection.
	gosqlite.MustRegisterScalarFunction(clockFunc, 1, func(_ *gosqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
		id, ok := args[0].(int64)
		if !ok {
			return nil, fmt.Errorf("gormstore: %s: clock id must be an integer, got %T", clockFunc, args[0])
		}
		now, ok := clocks.Load(id)
		if !ok {
			return nil, errors.New("gormstore: " + clockFunc + ": the store that owned this clock is gone")
		}
		// The stored text form (strftime '%Y-%m-%d %H:%M:%f').
		return now.(func() time.Time)().UTC().Format("2006-01-02 15:04:05.000"), nil
	})
}

// useClock rewrites the dialect's "now" to read now through clockFunc. The
// registration is dropped when the store is garbage collected.
func (s *Store) useClock(now func() time.Time) error {
	if s.dialect.name != DialectSQLite {
		return fmt.Errorf("gormstore: WithClock is supported on SQLite only (the %s dialect decides with the database's own clock)", s.dialect.name)
	}
	id := clockSeq.Add(1)
	clocks.Store(id, now)
	runtime.AddCleanup(s, func(id int64) { clocks.Delete(id) }, id)
	s.dialect.now = fmt.Sprintf("strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s(%d))", clockFunc, id)
	s.dialect.shifted = fmt.Sprintf("strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s(%d), ?)", clockFunc, id)
	return nil
}
