package gormstore

import (
	"context"
	"database/sql"
	"strconv"
	"strings"

	"gorm.io/gorm"
)

// The hot-path statements (the inbox's lock, mark and release, the outbox's
// insert) run on the connection pool GORM holds for db — the transaction's
// when db is one, a custom gorm.ConnPool included — but without GORM's
// statement builder, callbacks and reflection-based scans: each GORM call
// costs several dozen allocations and a few microseconds of CPU on top of
// the driver's own work, per statement. The statements are the store's own
// constant SQL with bind parameters; GORM's logger and plugins do not see
// them.

// conn returns the connection pool a statement on db runs on.
func conn(db *gorm.DB) gorm.ConnPool { return db.Statement.ConnPool }

// execSQL runs a statement of the store on db's pool.
func execSQL(ctx context.Context, db *gorm.DB, stmt string, args ...any) (sql.Result, error) {
	return conn(db).ExecContext(ctx, stmt, args...)
}

// querySQL runs a statement of the store that returns rows on db's pool. The
// caller closes the rows.
func querySQL(ctx context.Context, db *gorm.DB, stmt string, args ...any) (*sql.Rows, error) {
	return conn(db).QueryContext(ctx, stmt, args...)
}

// bind rewrites the ? placeholders of a store statement in the dialect's
// native form: $1, $2, … on PostgreSQL (SQLite takes ? as they are). The
// store's statements contain no ? other than placeholders.
func (d dialect) bind(q string) string {
	if d.name != DialectPostgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}
