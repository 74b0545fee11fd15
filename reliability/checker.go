package reliability

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/reliability/workload"
)

// Report is what the exactly-once-effect checker found in a run's tables.
// It is computed from the database alone, so it holds whatever the
// processes did, however they died.
type Report struct {
	// Committed counts produced rows: producer transactions that committed.
	Committed int64
	// RolledBack counts producer transactions rolled back on purpose.
	RolledBack int64
	// Republished counts committed re-publishes of an already committed id.
	Republished int64

	// Effects has one entry per order endpoint.
	Effects []EffectCheck
	// Followups checks the audit endpoint's rows, per source endpoint.
	Followups []EffectCheck
	// FollowupIDsDoubled counts follow-up message ids with more than one row.
	FollowupIDsDoubled int64

	// Outbox rows by state. Pending and Leased must be 0 once drained.
	OutboxPending, OutboxLeased, OutboxParked, OutboxDelivered int64
	// OutboxOrderRows counts outbox rows carrying orders; it must equal
	// Committed + Republished (one row per committed publish).
	OutboxOrderRows int64
	// OutboxPhantomOrders counts order rows in the outbox whose id never
	// committed a produced row (a publish without its commit).
	OutboxPhantomOrders int64
	// OutboxRolledBack counts outbox rows for deliberately rolled-back ids.
	OutboxRolledBack int64
	// OutboxMaxAttempts is the highest failed-delivery count of any row.
	OutboxMaxAttempts int64
	// OutboxRows counts every outbox row, whatever its state.
	OutboxRows int64
	// DirectDelivery is set (by the harness, after Check) for a run on the
	// PostgreSQL transport: publishes in a transaction on its database
	// write queue rows in that transaction, so the outbox must stay empty
	// (OutboxRows 0) instead of holding one order row per committed
	// publish. That publishes happen iff their transaction commits is then
	// shown by the effects alone: no row for a rolled-back id (phantom),
	// none missing for a committed one.
	DirectDelivery bool

	// Inbox rows: processed, and unprocessed (locked or abandoned; must be
	// 0 once drained). InboxReattempts sums attempts beyond the first over
	// processed rows: in-process retries, redeliveries after crashes, and
	// takeovers after fencing.
	InboxProcessed, InboxUnprocessed, InboxReattempts, InboxMaxAttempts int64
}

// EffectCheck is the check of one effect key space (an endpoint's effect
// rows, or the follow-ups from one source endpoint).
type EffectCheck struct {
	Name string
	// Rows counts rows; Distinct counts distinct committed ids among them.
	Rows, Distinct int64
	// Missing counts committed ids with no row (a lost effect).
	Missing int64
	// Doubled counts ids with more than one row; ExtraRows the surplus rows.
	Doubled, ExtraRows int64
	// Phantom counts rows whose id never committed (rolled back or unknown).
	Phantom int64
	// Samples are a few offending ids, for debugging.
	Samples []string
}

func (e EffectCheck) ok() bool { return e.Missing == 0 && e.Doubled == 0 && e.Phantom == 0 }

// Failures lists every violated guarantee; empty means the run is clean.
func (r *Report) Failures() []string {
	var out []string
	for _, group := range [][]EffectCheck{r.Effects, r.Followups} {
		for _, e := range group {
			if !e.ok() {
				out = append(out, fmt.Sprintf("%s: %d missing, %d doubled (%d extra rows), %d phantom; e.g. %s",
					e.Name, e.Missing, e.Doubled, e.ExtraRows, e.Phantom, strings.Join(e.Samples, ", ")))
			}
		}
	}
	if r.FollowupIDsDoubled > 0 {
		out = append(out, fmt.Sprintf("audit: %d follow-up message ids consumed more than once", r.FollowupIDsDoubled))
	}
	if r.OutboxPending > 0 || r.OutboxLeased > 0 || r.OutboxParked > 0 {
		out = append(out, fmt.Sprintf("outbox not drained: %d pending (%d leased), %d parked", r.OutboxPending, r.OutboxLeased, r.OutboxParked))
	}
	if r.OutboxPhantomOrders > 0 || r.OutboxRolledBack > 0 {
		out = append(out, fmt.Sprintf("publish without commit: %d outbox order rows with no produced row (%d of rolled-back ids)", r.OutboxPhantomOrders, r.OutboxRolledBack))
	}
	switch want := r.Committed + r.Republished; {
	case r.DirectDelivery && r.OutboxRows != 0:
		out = append(out, fmt.Sprintf("outbox holds %d rows (%d orders); want none: on the PostgreSQL transport a publish in a transaction on its database goes straight to the queue, with no outbox row and no relay hop", r.OutboxRows, r.OutboxOrderRows))
	case !r.DirectDelivery && r.OutboxOrderRows != want:
		out = append(out, fmt.Sprintf("outbox holds %d order rows; want %d (committed %d + republished %d)", r.OutboxOrderRows, want, r.Committed, r.Republished))
	}
	if r.InboxUnprocessed > 0 {
		out = append(out, fmt.Sprintf("inbox not drained: %d unprocessed (locked or abandoned) entries", r.InboxUnprocessed))
	}
	if want := 4 * r.Committed; r.InboxProcessed != want {
		out = append(out, fmt.Sprintf("inbox holds %d processed entries; want %d (2 order endpoints + 2 follow-ups per committed id)", r.InboxProcessed, want))
	}
	return out
}

// Check runs the exactly-once-effect checker over the tables of run n. It
// only reads.
func Check(ctx context.Context, db *gorm.DB, n workload.Names) (*Report, error) {
	if err := n.Validate(); err != nil {
		return nil, err
	}
	db = db.WithContext(ctx)
	var (
		produced    = n.Table(workload.TableProduced)
		rolledBack  = n.Table(workload.TableRolledBack)
		republished = n.Table(workload.TableRepublished)
		effects     = n.Table(workload.TableEffects)
		followups   = n.Table(workload.TableFollowups)
		outboxT     = n.Table("outbox")
		inboxT      = n.Table("inbox")
		// Poison messages (the poison profile) are judged by CheckPoison:
		// their outbox and inbox rows are left out here.
		notPoison = ` NOT IN (SELECT message_id FROM ` + n.Table(workload.TablePoison) + ` WHERE message_id IS NOT NULL)`
	)
	r := &Report{}
	var err error
	scan := func(dst any, sql string, args ...any) {
		if err != nil {
			return
		}
		if e := db.Raw(sql, args...).Row().Scan(dst); e != nil {
			err = fmt.Errorf("reliability: check: %w\n%s", e, sql)
		}
	}
	scan(&r.Committed, `SELECT count(*) FROM `+produced)
	scan(&r.RolledBack, `SELECT count(*) FROM `+rolledBack)
	scan(&r.Republished, `SELECT count(*) FROM `+republished)

	// keyed checks one key space: rows of table where col = key, keyed by
	// idCol, against the produced ids.
	keyed := func(name, table, idCol, keyCol, key string) EffectCheck {
		e := EffectCheck{Name: name}
		where := keyCol + ` = ?`
		scan(&e.Rows, `SELECT count(*) FROM `+table+` WHERE `+where, key)
		scan(&e.Distinct, `SELECT count(DISTINCT t.`+idCol+`) FROM `+table+` t JOIN `+produced+` p ON p.message_id = t.`+idCol+` WHERE t.`+where, key)
		scan(&e.Missing, `SELECT count(*) FROM `+produced+` p WHERE NOT EXISTS (SELECT 1 FROM `+table+` t WHERE t.`+idCol+` = p.message_id AND t.`+where+`)`, key)
		var extra struct{ n, rows int64 }
		scan(&extra.n, `SELECT count(*) FROM (SELECT `+idCol+` FROM `+table+` WHERE `+where+` GROUP BY `+idCol+` HAVING count(*) > 1) d`, key)
		scan(&extra.rows, `SELECT coalesce(sum(c - 1), 0) FROM (SELECT count(*) AS c FROM `+table+` WHERE `+where+` GROUP BY `+idCol+` HAVING count(*) > 1) d`, key)
		e.Doubled, e.ExtraRows = extra.n, extra.rows
		scan(&e.Phantom, `SELECT count(*) FROM `+table+` t WHERE t.`+where+` AND NOT EXISTS (SELECT 1 FROM `+produced+` p WHERE p.message_id = t.`+idCol+`)`, key)
		if err == nil && !e.ok() {
			var ids []string
			db.Raw(`(SELECT 'missing '||p.message_id FROM `+produced+` p WHERE NOT EXISTS (SELECT 1 FROM `+table+` t WHERE t.`+idCol+` = p.message_id AND t.`+where+`) LIMIT 3)
UNION ALL (SELECT 'doubled '||`+idCol+` FROM `+table+` WHERE `+where+` GROUP BY `+idCol+` HAVING count(*) > 1 LIMIT 3)
UNION ALL (SELECT 'phantom '||t.`+idCol+` FROM `+table+` t WHERE t.`+where+` AND NOT EXISTS (SELECT 1 FROM `+produced+` p WHERE p.message_id = t.`+idCol+`) LIMIT 3)`,
				key, key, key).Scan(&ids)
			e.Samples = ids
		}
		return e
	}
	for _, ep := range n.OrderEndpoints() {
		r.Effects = append(r.Effects, keyed(ep, effects, "message_id", "endpoint", ep))
	}
	for _, ep := range n.OrderEndpoints() {
		r.Followups = append(r.Followups, keyed(n.Audit()+" <- "+ep, followups, "origin_id", "source_endpoint", ep))
	}
	scan(&r.FollowupIDsDoubled, `SELECT count(*) FROM (SELECT followup_id FROM `+followups+` GROUP BY followup_id HAVING count(*) > 1) d`)

	scan(&r.OutboxPending, `SELECT count(*) FROM `+outboxT+` WHERE status = 'pending' AND message_id`+notPoison)
	scan(&r.OutboxLeased, `SELECT count(*) FROM `+outboxT+` WHERE status = 'pending' AND locked_until IS NOT NULL AND message_id`+notPoison)
	scan(&r.OutboxParked, `SELECT count(*) FROM `+outboxT+` WHERE status = 'parked' AND message_id`+notPoison)
	scan(&r.OutboxDelivered, `SELECT count(*) FROM `+outboxT+` WHERE status = 'delivered'`)
	scan(&r.OutboxMaxAttempts, `SELECT coalesce(max(attempts), 0) FROM `+outboxT)
	scan(&r.OutboxRows, `SELECT count(*) FROM `+outboxT+` WHERE message_id`+notPoison)
	scan(&r.OutboxOrderRows, `SELECT count(*) FROM `+outboxT+` WHERE message_type = ? AND message_id`+notPoison, n.OrderType())
	scan(&r.OutboxPhantomOrders, `SELECT count(*) FROM `+outboxT+` o WHERE o.message_type = ? AND o.message_id`+notPoison+` AND NOT EXISTS (SELECT 1 FROM `+produced+` p WHERE p.message_id = o.message_id)`, n.OrderType())
	scan(&r.OutboxRolledBack, `SELECT count(*) FROM `+outboxT+` o JOIN `+rolledBack+` b ON b.message_id = o.message_id`)

	scan(&r.InboxProcessed, `SELECT count(*) FROM `+inboxT+` WHERE processed_at IS NOT NULL AND message_id`+notPoison)
	scan(&r.InboxUnprocessed, `SELECT count(*) FROM `+inboxT+` WHERE processed_at IS NULL AND message_id`+notPoison)
	scan(&r.InboxReattempts, `SELECT coalesce(sum(attempts - 1), 0) FROM `+inboxT+` WHERE processed_at IS NOT NULL`)
	scan(&r.InboxMaxAttempts, `SELECT coalesce(max(attempts), 0) FROM `+inboxT)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Progress is the cheap subset of the checker the harness polls while it
// waits for a run to drain.
type Progress struct {
	Committed, EffectRows, FollowupRows, OutboxPending, InboxUnprocessed int64
}

// Complete reports whether every committed id could have all its effects
// and nothing is left to deliver or process.
func (p Progress) Complete() bool {
	return p.Committed > 0 && p.EffectRows >= 2*p.Committed && p.FollowupRows >= 2*p.Committed &&
		p.OutboxPending == 0 && p.InboxUnprocessed == 0
}

func (p Progress) String() string {
	return fmt.Sprintf("committed=%d effects=%d/%d followups=%d/%d outbox_pending=%d inbox_unprocessed=%d",
		p.Committed, p.EffectRows, 2*p.Committed, p.FollowupRows, 2*p.Committed, p.OutboxPending, p.InboxUnprocessed)
}

// ReadProgress reads the Progress of run n.
func ReadProgress(ctx context.Context, db *gorm.DB, n workload.Names) (Progress, error) {
	var p Progress
	notPoison := ` NOT IN (SELECT message_id FROM ` + n.Table(workload.TablePoison) + ` WHERE message_id IS NOT NULL)`
	err := db.WithContext(ctx).Raw(`SELECT
(SELECT count(*) FROM `+n.Table(workload.TableProduced)+`),
(SELECT count(*) FROM `+n.Table(workload.TableEffects)+`),
(SELECT count(*) FROM `+n.Table(workload.TableFollowups)+`),
(SELECT count(*) FROM `+n.Table("outbox")+` WHERE status = 'pending' AND message_id`+notPoison+`),
(SELECT count(*) FROM `+n.Table("inbox")+` WHERE processed_at IS NULL AND message_id`+notPoison+`)`).Row().
		Scan(&p.Committed, &p.EffectRows, &p.FollowupRows, &p.OutboxPending, &p.InboxUnprocessed)
	return p, err
}

// sortedKeys returns m's keys in order.
func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}
