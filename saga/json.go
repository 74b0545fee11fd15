package saga

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// JSON keeps a value of T in one JSON column of the instance's table:
// jsonb on PostgreSQL (so SQL can query into it), text on SQLite. Use it
// for saga data that is a document rather than columns:
//
//	type Order struct {
//		saga.State
//		Lines saga.JSON[[]Line]
//	}
//
// The value is c.Instance.Lines.Data. It encodes to JSON (for the admin
// API, say) as the value itself. A GORM field tagged serializer:json does
// the same with a column type of your choosing.
type JSON[T any] struct {
	Data T
}

// Value implements driver.Valuer.
func (j JSON[T]) Value() (driver.Value, error) {
	b, err := json.Marshal(j.Data)
	if err != nil {
		return nil, fmt.Errorf("saga.JSON[%T]: encode: %w", j.Data, err)
	}
	return string(b), nil
}

// Scan implements sql.Scanner; NULL leaves the zero value.
func (j *JSON[T]) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case nil:
		var zero T
		j.Data = zero
		return nil
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		return fmt.Errorf("saga.JSON[%T]: cannot scan a %T; the column must hold JSON text", j.Data, src)
	}
	var d T
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("saga.JSON[%T]: decode: %w", j.Data, err)
	}
	j.Data = d
	return nil
}

// MarshalJSON encodes the value itself.
func (j JSON[T]) MarshalJSON() ([]byte, error) { return json.Marshal(j.Data) }

// UnmarshalJSON decodes the value itself.
func (j *JSON[T]) UnmarshalJSON(b []byte) error { return json.Unmarshal(b, &j.Data) }

// GormDataType implements schema.GormDataTypeInterface.
func (JSON[T]) GormDataType() string { return "json" }

// GormDBDataType implements migrator.GormDataTypeInterface: jsonb on
// PostgreSQL, text elsewhere.
func (JSON[T]) GormDBDataType(db *gorm.DB, _ *schema.Field) string {
	if db.Dialector.Name() == "postgres" {
		return "jsonb"
	}
	return "text"
}
