package gormstore

import (
	"database/sql/driver"
	"fmt"
	"time"
)

// dbTime scans a database timestamp that may be NULL. SQLite hands back
// time.Time for DATETIME columns but plain text for computed values (MIN,
// RETURNING of expressions), so both are accepted; every value is returned
// in UTC.
type dbTime struct {
	Time  time.Time
	Valid bool
}

// sqliteTimeFormats are the text forms SQLite times arrive in: ours
// (strftime '%Y-%m-%d %H:%M:%f') first.
var sqliteTimeFormats = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	time.RFC3339Nano,
}

// Scan implements sql.Scanner.
func (t *dbTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*t = dbTime{}
		return nil
	case time.Time:
		*t = dbTime{Time: v.UTC(), Valid: true}
		return nil
	case string:
		return t.parse(v)
	case []byte:
		return t.parse(string(v))
	}
	return fmt.Errorf("gormstore: cannot scan %T into a time", src)
}

func (t *dbTime) parse(s string) error {
	for _, layout := range sqliteTimeFormats {
		if v, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			*t = dbTime{Time: v.UTC(), Valid: true}
			return nil
		}
	}
	return fmt.Errorf("gormstore: cannot parse time %q", s)
}

// Value implements driver.Valuer; the store never writes times from Go (the
// database clock is the only clock), but GORM's schema parser expects
// scanner types to be valuers too.
func (t dbTime) Value() (driver.Value, error) {
	if !t.Valid {
		return nil, nil
	}
	return t.Time, nil
}

// ptr returns the time as a pointer, nil when NULL.
func (t dbTime) ptr() *time.Time {
	if !t.Valid {
		return nil
	}
	v := t.Time
	return &v
}
