package main

import (
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/view"
	"github.com/barewire-go/barewire/outbox"
)

func (c *cli) migrate(args []string) error {
	fs := c.flags("migrate")
	printSQL := fs.Bool("print", false, "print the SQL instead of running it (no connection is made)")
	dialect := fs.String("dialect", "", "dialect for --print without --dsn: postgres or sqlite")
	if _, err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *printSQL {
		d := *dialect
		if d == "" {
			var err error
			if d, _, err = dsnDialect(c.dsn); err != nil {
				return usagef("migrate --print needs --dialect postgres|sqlite or a --dsn to take it from")
			}
		}
		script, err := gormstore.MigrationSQL(d, c.prefix)
		if err != nil {
			return err
		}
		_, err = fmt.Fprint(c.stdout, script)
		return err
	}
	db, store, err := c.open(true)
	if err != nil {
		return err
	}
	defer closeDB(db)
	start := time.Now()
	if err := store.Migrate(c.ctx); err != nil {
		return err
	}
	tables := []string{c.prefix + "inbox", c.prefix + "outbox"}
	if c.json {
		return c.printJSON(map[string]any{"migrated": true, "dialect": store.Dialect(), "tables": tables})
	}
	fmt.Fprintf(c.stdout, "migrated %s: tables %s and %s are up to date (%s)\n", store.Dialect(), tables[0], tables[1], fmtAge(time.Since(start)))
	return nil
}

// parseNoArgs parses flags of a command that takes no positional arguments.
func parseNoArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, usagef("%s takes no arguments, got %q", fs.Name(), pos)
	}
	return nil, nil
}

type statsOutput struct {
	Outbox struct {
		Pending                 int64      `json:"pending"`
		Parked                  int64      `json:"parked"`
		OldestPending           *time.Time `json:"oldestPending,omitempty"`
		OldestPendingAgeSeconds float64    `json:"oldestPendingAgeSeconds"`
	} `json:"outbox"`
	Inbox struct {
		Locked  int64 `json:"locked"`
		Expired int64 `json:"expired"`
	} `json:"inbox"`
}

func (c *cli) stats(args []string) error {
	fs := c.flags("stats")
	if _, err := parseNoArgs(fs, args); err != nil {
		return err
	}
	db, store, err := c.open(false)
	if err != nil {
		return err
	}
	defer closeDB(db)
	ost, err := store.Outbox().Stats(c.ctx)
	if err != nil {
		return err
	}
	ist, err := store.Inbox().Stats(c.ctx)
	if err != nil {
		return err
	}
	var out statsOutput
	out.Outbox.Pending, out.Outbox.Parked = ost.Pending, ost.Parked
	age := "-"
	if !ost.OldestPending.IsZero() {
		t := ost.OldestPending.UTC()
		out.Outbox.OldestPending = &t
		d := max(time.Since(t), 0)
		out.Outbox.OldestPendingAgeSeconds = d.Seconds()
		age = fmtAge(d)
	}
	out.Inbox.Locked, out.Inbox.Expired = ist.Locked, ist.Expired
	if c.json {
		return c.printJSON(out)
	}
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	if err := c.table([]string{"OUTBOX", "PENDING", "PARKED", "OLDEST PENDING AGE"},
		[][]string{{c.prefix + "outbox", n(ost.Pending), n(ost.Parked), age}}); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout)
	return c.table([]string{"INBOX", "LOCKED", "EXPIRED"},
		[][]string{{c.prefix + "inbox", n(ist.Locked), n(ist.Expired)}})
}

// ---- inbox ----

func (c *cli) inboxList(args []string) error {
	fs := c.flags("inbox ls")
	id := fs.String("message-id", "", "only this message id")
	consumer := fs.String("consumer-type", "", "only this consumer type (endpoint name)")
	processed := fs.String("processed", "", "true: processed entries only; false: unprocessed only")
	limit := fs.Int("limit", 50, "entries per page (1-10000)")
	offset := fs.Int("offset", 0, "entries to skip (newest first)")
	if _, err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *limit < 1 || *limit > 10000 || *offset < 0 {
		return usagef("--limit must be within 1-10000 and --offset not negative")
	}
	q := inbox.Query{MessageID: *id, ConsumerType: *consumer, Limit: *limit, Offset: *offset}
	if *processed != "" {
		v, err := strconv.ParseBool(*processed)
		if err != nil {
			return usagef("--processed %q: want true or false", *processed)
		}
		q.Processed = &v
	}
	return c.listInbox(q)
}

func (c *cli) inboxShow(args []string) error {
	fs := c.flags("inbox show")
	consumer := fs.String("consumer-type", "", "only this consumer type (endpoint name)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("inbox show takes one message id")
	}
	n, err := c.listInboxCount(inbox.Query{MessageID: pos[0], ConsumerType: *consumer, Limit: 1000})
	if err == nil && n == 0 {
		return fmt.Errorf("no inbox entry for message id %q", pos[0])
	}
	return err
}

// inboxRelease drops the lock of one consumer type's unprocessed entry
// whatever its token (gormstore.Inbox.ForceRelease): the way out of a lock
// left by a delivery that will never finish.
func (c *cli) inboxRelease(args []string) error {
	fs := c.flags("inbox release")
	consumer := fs.String("consumer-type", "", "the consumer type (endpoint name) whose lock to release; required")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *consumer == "" {
		return usagef("inbox release takes one message id and --consumer-type")
	}
	db, store, err := c.open(false)
	if err != nil {
		return err
	}
	defer closeDB(db)
	key := inbox.Key{MessageID: pos[0], ConsumerType: *consumer}
	released, err := store.Inbox().ForceRelease(c.ctx, key)
	if err != nil {
		return err
	}
	if !released {
		return fmt.Errorf("no locked, unprocessed inbox entry for message id %q and consumer type %q: nothing released", key.MessageID, key.ConsumerType)
	}
	if c.json {
		return c.printJSON(map[string]any{"released": true, "messageId": key.MessageID, "consumerType": key.ConsumerType})
	}
	fmt.Fprintf(c.stdout, "released the lock of %s/%s: the next delivery takes the entry at once; a holder still running can no longer commit\n", key.MessageID, key.ConsumerType)
	return nil
}

func (c *cli) listInbox(q inbox.Query) error {
	_, err := c.listInboxCount(q)
	return err
}

// listInboxCount prints the entries q matches and returns how many.
func (c *cli) listInboxCount(q inbox.Query) (int, error) {
	db, store, err := c.open(false)
	if err != nil {
		return 0, err
	}
	defer closeDB(db)
	entries, err := store.Inbox().List(c.ctx, q)
	if err != nil {
		return 0, err
	}
	out := view.Inboxes(entries, time.Now())
	if c.json {
		return len(out), c.printJSON(out)
	}
	if len(out) == 0 {
		fmt.Fprintln(c.stderr, "no inbox entries match")
		return 0, nil
	}
	rows := make([][]string, len(out))
	for i, e := range out {
		expires := "-" // a processed entry holds no lock
		if e.ProcessedAt == nil {
			expires = fmtTime(e.ExpiresAt)
		}
		rows[i] = []string{e.MessageID, e.ConsumerType, e.State, fmtTime(e.ReceivedAt), fmtTimePtr(e.ProcessedAt),
			expires, strconv.Itoa(e.Attempts)}
	}
	return len(out), c.table([]string{"MESSAGE ID", "CONSUMER TYPE", "STATE", "RECEIVED", "PROCESSED", "LOCK EXPIRES", "ATTEMPTS"}, rows)
}

// ---- outbox ----

func (c *cli) outboxList(args []string) error {
	fs := c.flags("outbox ls")
	status := fs.String("status", "", "pending, parked or delivered (default: all)")
	after := fs.Int64("after-id", 0, "only rows with a greater id (paging)")
	limit := fs.Int("limit", 50, "rows per page (1-10000)")
	scheduled := fs.Bool("scheduled", false, "only scheduled rows not yet due (bus.Delay, bus.DeliverAt, delayed redeliveries)")
	if _, err := parseNoArgs(fs, args); err != nil {
		return err
	}
	switch outbox.Status(*status) {
	case "", outbox.StatusPending, outbox.StatusParked, outbox.StatusDelivered:
	default:
		return usagef("--status %q: want pending, parked or delivered", *status)
	}
	if *limit < 1 || *limit > 10000 || *after < 0 {
		return usagef("--limit must be within 1-10000 and --after-id not negative")
	}
	db, store, err := c.open(false)
	if err != nil {
		return err
	}
	defer closeDB(db)
	msgs, err := store.Outbox().List(c.ctx, outbox.Query{Status: outbox.Status(*status), AfterID: *after, Limit: *limit, Scheduled: *scheduled})
	if err != nil {
		return err
	}
	out := view.Outboxes(msgs)
	if c.json {
		return c.printJSON(out)
	}
	if len(out) == 0 {
		fmt.Fprintln(c.stderr, "no outbox rows match")
		return nil
	}
	rows := make([][]string, len(out))
	for i, r := range out {
		lastErr := r.LastError
		if lastErr == "" {
			lastErr = "-"
		}
		due := "-"
		if r.Status == string(outbox.StatusPending) && r.AvailableAt != nil && r.AvailableAt.After(r.CreatedAt) {
			due = fmtTime(*r.AvailableAt)
		}
		rows[i] = []string{strconv.FormatInt(r.ID, 10), r.MessageID, r.MessageType, r.Destination, r.Status,
			strconv.Itoa(r.Attempts), fmtTime(r.CreatedAt), due, truncate(lastErr, 60)}
	}
	if err := c.table([]string{"ID", "MESSAGE ID", "TYPE", "DESTINATION", "STATUS", "ATTEMPTS", "CREATED", "DUE", "LAST ERROR"}, rows); err != nil {
		return err
	}
	if len(out) == *limit {
		fmt.Fprintf(c.stderr, "more rows may follow: --after-id %d\n", out[len(out)-1].ID)
	}
	return nil
}

func (c *cli) outboxRequeue(args []string) error {
	fs := c.flags("outbox requeue")
	all := fs.Bool("all-parked", false, "requeue every parked row")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *all == (len(pos) > 0) {
		return usagef("outbox requeue takes parked row ids or --all-parked (one of them)")
	}
	ids := make([]int64, len(pos))
	for i, p := range pos {
		if ids[i], err = strconv.ParseInt(p, 10, 64); err != nil || ids[i] < 1 {
			return usagef("outbox row id %q: want a positive integer", p)
		}
	}
	db, store, err := c.open(false)
	if err != nil {
		return err
	}
	defer closeDB(db)
	n, err := store.Outbox().Requeue(c.ctx, ids)
	if err != nil {
		return err
	}
	if c.json {
		if err := c.printJSON(map[string]int{"requeued": n}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "requeued %d parked row(s); running relays send them within their polling interval\n", n)
	}
	if !*all && n < len(ids) {
		return fmt.Errorf("%d of the %d ids given are not parked outbox rows (no such row, or not parked): nothing done for them", len(ids)-n, len(ids))
	}
	return nil
}
