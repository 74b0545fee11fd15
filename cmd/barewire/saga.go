package main

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"time"

	"gorm.io/gorm"
)

// The columns of saga.State; the instance's own data are the other columns.
var sagaStateColumns = []string{"correlation_id", "current_state", "version", "created_at", "updated_at"}

// sagaTable matches a table name, optionally schema-qualified.
var sagaTable = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

func (c *cli) saga(sub string, args []string) error {
	fs := c.flags("saga " + sub)
	table := fs.String("table", "", "the machine's instance table (its GORM table name or saga.WithTable)")
	state := fs.String("state", "", "only instances in this state (ls)")
	limit := fs.Int("limit", 50, "instances to list (1-10000)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *table == "":
		return usagef("saga %s needs --table, the machine's instance table", sub)
	case !sagaTable.MatchString(*table):
		return usagef("--table %q: want a table name (letters, digits, _; optionally schema.table)", *table)
	case *limit < 1 || *limit > 10000:
		return usagef("--limit must be within 1-10000")
	case sub == "show" && len(pos) != 1:
		return usagef("saga show takes one correlation id")
	case sub != "show" && len(pos) > 0:
		return usagef("saga %s takes no arguments, got %q", sub, pos)
	}
	db, _, err := c.open(false)
	if err != nil {
		return err
	}
	defer closeDB(db)
	// GORM quotes the validated name, each part of schema.table.
	q := db.WithContext(c.ctx).Table(*table)
	switch sub {
	case "states":
		return c.sagaStates(q, *table)
	case "show":
		return c.sagaShow(q, *table, pos[0])
	}
	return c.sagaList(q, *table, *state, *limit)
}

func (c *cli) sagaStates(q *gorm.DB, table string) error {
	var rows []struct {
		CurrentState string `json:"state"`
		N            int64  `json:"instances"`
	}
	if err := q.Select("current_state, COUNT(*) AS n").Group("current_state").Order("current_state").Scan(&rows).Error; err != nil {
		return sagaErr(table, err)
	}
	if c.json {
		return c.printJSON(rows)
	}
	out := make([][]string, len(rows))
	for i, r := range rows {
		out[i] = []string{r.CurrentState, strconv.FormatInt(r.N, 10)}
	}
	return c.table([]string{"STATE", "INSTANCES"}, out)
}

func (c *cli) sagaList(q *gorm.DB, table, state string, limit int) error {
	if state != "" {
		q = q.Where("current_state = ?", state)
	}
	var rows []map[string]any
	// Least recently changed first: the instances stuck longest.
	if err := q.Order("updated_at, correlation_id").Limit(limit).Find(&rows).Error; err != nil {
		return sagaErr(table, err)
	}
	for _, r := range rows {
		normalize(r)
	}
	if c.json {
		return c.printJSON(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stderr, "no saga instances match")
		return nil
	}
	out := make([][]string, len(rows))
	now := time.Now()
	for i, r := range rows {
		updated := timeOf(r["updated_at"])
		idle := "-"
		if !updated.IsZero() {
			idle = fmtAge(now.Sub(updated))
		}
		out[i] = []string{fmt.Sprint(r["correlation_id"]), fmt.Sprint(r["current_state"]), fmt.Sprint(r["version"]),
			fmtTime(timeOf(r["created_at"])), fmtTime(updated), idle}
	}
	return c.table([]string{"CORRELATION ID", "STATE", "VERSION", "CREATED", "UPDATED", "UNCHANGED FOR"}, out)
}

func (c *cli) sagaShow(q *gorm.DB, table, id string) error {
	var rows []map[string]any
	if err := q.Where("correlation_id = ?", id).Limit(1).Find(&rows).Error; err != nil {
		return sagaErr(table, err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("saga instance %q not found in %s (finalized instances are deleted unless the machine keeps them)", id, table)
	}
	r := normalize(rows[0])
	if c.json {
		return c.printJSON(r)
	}
	keys := append([]string(nil), sagaStateColumns...)
	var data []string
	for k := range r {
		if !contains(sagaStateColumns, k) {
			data = append(data, k)
		}
	}
	sort.Strings(data)
	out := [][]string{}
	for _, k := range append(keys, data...) {
		v, ok := r[k]
		if !ok {
			continue
		}
		s := fmt.Sprint(v)
		if t, ok := v.(time.Time); ok {
			s = fmtTime(t)
		}
		if v == nil {
			s = "-"
		}
		out = append(out, []string{k, truncate(s, 200)})
	}
	return c.table([]string{"COLUMN", "VALUE"}, out)
}

func sagaErr(table string, err error) error {
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return err
	}
	return fmt.Errorf("read saga table %s: %w (is it the machine's instance table, with saga.State's columns?)", table, err)
}

// normalize makes a scanned row printable: bytes as text, SQLite's
// text timestamps as times.
func normalize(r map[string]any) map[string]any {
	for k, v := range r {
		switch v := v.(type) {
		case []byte:
			r[k] = string(v)
		case string:
			if k == "created_at" || k == "updated_at" {
				if t := timeOf(v); !t.IsZero() {
					r[k] = t
				}
			}
		}
	}
	return r
}

func timeOf(v any) time.Time {
	switch v := v.(type) {
	case time.Time:
		return v
	case string:
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999"} {
			if t, err := time.Parse(layout, v); err == nil {
				return t
			}
		}
	}
	return time.Time{}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
