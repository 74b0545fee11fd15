package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

type purgeTable string

const (
	tableInbox  purgeTable = "inbox"
	tableOutbox purgeTable = "outbox"
)

// purgeSQL holds one purge's statements and their arguments (without the
// batch size, which the delete takes last).
type purgeSQL struct {
	count, del string
	args       []any
}

// purgeStatements builds the count and batched delete of a purge. Rows are
// judged by the database's clock, as the bus's own cleanup does. On
// PostgreSQL rows locked by running processes are skipped, not waited for.
func purgeStatements(dialect, prefix string, tbl purgeTable, age time.Duration, includePending bool) purgeSQL {
	var cutoff string
	var arg any
	if dialect == dialectPostgres {
		cutoff, arg = "(now() - make_interval(secs => ?))", age.Seconds()
	} else {
		cutoff, arg = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)", fmt.Sprintf("%+.3f seconds", -age.Seconds())
	}
	table := prefix + string(tbl) // the prefix is validated by gormstore.New
	var where, key string
	args := []any{arg}
	if tbl == tableInbox {
		key = "message_id, consumer_type"
		where = "(processed_at IS NOT NULL AND processed_at < " + cutoff + ")"
		if includePending {
			where += " OR (processed_at IS NULL AND received_at < " + cutoff + ")"
			args = append(args, arg)
		}
	} else {
		key = "id"
		where = "(status = 'delivered' AND delivered_at < " + cutoff + ")"
		if includePending {
			where += " OR (status <> 'delivered' AND created_at < " + cutoff + ")"
			args = append(args, arg)
		}
	}
	s := purgeSQL{count: "SELECT COUNT(*) FROM " + table + " WHERE " + where, args: args}
	if dialect == dialectPostgres {
		s.del = "DELETE FROM " + table + " WHERE (" + key + ") IN (SELECT " + key + " FROM " + table +
			" WHERE " + where + " LIMIT ? FOR UPDATE SKIP LOCKED)"
	} else {
		s.del = "DELETE FROM " + table + " WHERE rowid IN (SELECT rowid FROM " + table + " WHERE " + where + " LIMIT ?)"
	}
	return s
}

type purgeResult struct {
	Table          string  `json:"table"`
	OlderThan      string  `json:"olderThan"`
	IncludePending bool    `json:"includePending"`
	DryRun         bool    `json:"dryRun,omitempty"`
	Matched        int64   `json:"matched"`
	Deleted        int64   `json:"deleted"`
	Batches        int     `json:"batches"`
	Seconds        float64 `json:"seconds"`
}

func (c *cli) purge(tbl purgeTable, args []string) error {
	fs := c.flags(string(tbl) + " purge")
	olderThanFlag := fs.String("older-than", "7d", "purge rows older than this (90m, 36h, 7d); default the 7-day retention")
	batch := fs.Int("batch", 1000, "rows per delete statement (1-100000)")
	includePending := fs.Bool("include-pending", false, "also delete unprocessed inbox entries / pending and parked outbox rows (needs --yes)")
	yes := fs.Bool("yes", false, "confirm --include-pending")
	dryRun := fs.Bool("dry-run", false, "only count what would be deleted")
	if _, err := parseNoArgs(fs, args); err != nil {
		return err
	}
	age, err := parseAge(*olderThanFlag)
	if err != nil {
		return usagef("--older-than: %v", err)
	}
	if *batch < 1 || *batch > 100000 {
		return usagef("--batch %d: want 1-100000", *batch)
	}
	what := map[purgeTable]string{tableInbox: "unprocessed inbox entries", tableOutbox: "pending and parked outbox rows"}[tbl]
	if *includePending && !*yes && !*dryRun {
		return usagef("--include-pending deletes %s: messages not yet handled are lost (or handled twice). Add --yes to confirm", what)
	}
	db, store, err := c.open(false)
	if err != nil {
		return err
	}
	defer closeDB(db)
	q := purgeStatements(store.Dialect(), store.TablePrefix(), tbl, age, *includePending)
	res := purgeResult{Table: store.TablePrefix() + string(tbl), OlderThan: age.String(), IncludePending: *includePending, DryRun: *dryRun}
	if err := db.WithContext(c.ctx).Raw(q.count, q.args...).Scan(&res.Matched).Error; err != nil {
		return fmt.Errorf("count rows to purge: %w", err)
	}
	start := time.Now()
	if !*dryRun && res.Matched > 0 {
		p := newProgress(c.stderr, "purging "+res.Table, res.Matched)
		delArgs := append(append([]any{}, q.args...), *batch)
		for {
			r := db.WithContext(c.ctx).Exec(q.del, delArgs...)
			if r.Error != nil {
				p.finish()
				return fmt.Errorf("purge %s after %d deleted rows: %w", res.Table, res.Deleted, r.Error)
			}
			res.Batches++
			res.Deleted += r.RowsAffected
			p.set(res.Deleted)
			// Stop at the first empty batch: a short one may only mean rows
			// locked by a running process were skipped.
			if r.RowsAffected == 0 {
				break
			}
			if err := c.ctx.Err(); err != nil {
				p.finish()
				return fmt.Errorf("interrupted after deleting %d rows: %w", res.Deleted, err)
			}
		}
		p.finish()
	}
	res.Seconds = time.Since(start).Seconds()
	if c.json {
		return c.printJSON(res)
	}
	kept := map[purgeTable]string{tableInbox: "processed entries", tableOutbox: "delivered rows"}[tbl]
	scope := kept
	if *includePending {
		scope = kept + " and " + what
	}
	if *dryRun {
		fmt.Fprintf(c.stdout, "%s: %d %s older than %s would be deleted (dry run)\n", res.Table, res.Matched, scope, fmtAge(age))
		return nil
	}
	fmt.Fprintf(c.stdout, "%s: deleted %d %s older than %s in %d batch(es) of up to %d (%s)\n",
		res.Table, res.Deleted, scope, fmtAge(age), res.Batches, *batch, fmtAge(time.Since(start)))
	return nil
}

// progress draws a text progress bar on w: redrawn in place on a terminal,
// one line per tenth otherwise (logs, CI).
type progress struct {
	w        io.Writer
	label    string
	total    int64
	done     int64
	tty      bool
	lastStep int64
	started  time.Time
	drawn    bool
}

func newProgress(w io.Writer, label string, total int64) *progress {
	p := &progress{w: w, label: label, total: max(total, 1), started: time.Now(), lastStep: -1}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	p.draw()
	return p
}

func (p *progress) set(done int64) {
	p.done = done
	p.draw()
}

func (p *progress) draw() {
	done := min(p.done, p.total) // rows added meanwhile may exceed the count
	step := done * 10 / p.total
	if !p.tty && step == p.lastStep {
		return
	}
	p.lastStep = step
	const width = 30
	filled := int(done * width / p.total)
	line := fmt.Sprintf("%s [%s%s] %3d%% %d/%d rows", p.label, strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		done*100/p.total, p.done, p.total)
	if p.tty {
		fmt.Fprintf(p.w, "\r%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
	p.drawn = true
}

func (p *progress) finish() {
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
	}
}
