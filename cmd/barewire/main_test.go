package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/inbox"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/internal/view"
	"github.com/barewire-go/barewire/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// barewire runs the CLI in process and returns its exit code and outputs.
func barewire(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// ok runs the CLI and fails the test unless it exits 0.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := barewire(t, args...)
	if code != 0 {
		t.Fatalf("barewire %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%v in %q", err, s)
	}
	return v
}

func TestCLISQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bus.db")
	code, _, errOut := barewire(t, "stats", "--dsn", path)
	if code != exitError || !strings.Contains(errOut, "barewire migrate") {
		t.Errorf("stats on a missing file = %d %q; want an error that suggests migrate", code, errOut)
	}
	ok(t, "migrate", "--dsn", "sqlite:"+path)
	db, err := gormstore.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	testCLI(t, db, path, gormstore.DefaultTablePrefix)
}

func TestCLIPostgres(t *testing.T) {
	t.Parallel()
	dsn := testenv.PostgresDSN(t)
	prefix := "cli_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_"
	ok(t, "migrate", "--dsn", dsn, "--prefix", prefix)
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tbl := range []string{"inbox", "outbox"} {
			db.Exec(`DROP TABLE IF EXISTS "` + prefix + tbl + `"`)
		}
		closeDB(db)
	})
	ok(t, "migrate", "--dsn", dsn, "--prefix", prefix) // idempotent
	testCLI(t, db, dsn, prefix)
}

// seed writes 2 delivered, 1 parked and 1 pending outbox rows, and 3
// processed and 1 locked inbox entries.
func seed(t *testing.T, db *gorm.DB, prefix string) {
	t.Helper()
	ctx := context.Background()
	store, err := gormstore.New(db, gormstore.WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ob := store.Outbox()
	err = db.Transaction(func(tx *gorm.DB) error {
		var msgs []*outbox.Message
		for _, id := range []string{"out-1", "out-2", "out-3", "out-4"} {
			msgs = append(msgs, &outbox.Message{MessageID: id, Destination: "exchange:OrderPlaced", MessageType: "OrderPlaced",
				ContentType: "application/json", Payload: []byte(`{"orderId":"` + id + `"}`), Headers: map[string]string{"tenant": "acme"}})
		}
		return ob.Add(gormstore.WithTx(ctx, tx), msgs)
	})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := ob.Claim(ctx, "cli-test", 2, time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim = %d, %v", len(claimed), err)
	}
	if _, err := ob.MarkDelivered(ctx, "cli-test", []int64{claimed[0].ID, claimed[1].ID}, false); err != nil {
		t.Fatal(err)
	}
	claimed, err = ob.Claim(ctx, "cli-test", 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim = %d, %v", len(claimed), err)
	}
	if err := ob.Release(ctx, "cli-test", []int64{claimed[0].ID}, "NOT_FOUND - no exchange 'OrderPlaced'", true, 0, 1); err != nil {
		t.Fatal(err)
	}
	in := store.Inbox()
	for i, id := range []string{"in-1", "in-2", "in-3", "in-4"} {
		key := inbox.Key{MessageID: id, ConsumerType: "billing"}
		lock, err := in.TryLock(ctx, key, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if i < 3 {
			if err := in.Process(ctx, key, lock.Token, func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func testCLI(t *testing.T, db *gorm.DB, dsn, prefix string) {
	seed(t, db, prefix)
	common := []string{"--dsn", dsn, "--prefix", prefix}
	cmd := func(args ...string) []string { return append(args, common...) }

	type statsJSON struct {
		Outbox struct{ Pending, Parked int64 }
		Inbox  struct{ Locked, Expired int64 }
	}
	st := decode[statsJSON](t, ok(t, cmd("stats", "--json")...))
	if st.Outbox.Pending != 1 || st.Outbox.Parked != 1 || st.Inbox.Locked != 1 {
		t.Fatalf("stats = %+v", st)
	}
	text := ok(t, cmd("stats")...)
	if !strings.Contains(text, "PENDING") || !strings.Contains(text, prefix+"outbox") || !strings.Contains(text, prefix+"inbox") {
		t.Errorf("stats table:\n%s", text)
	}

	text = ok(t, cmd("outbox", "ls")...)
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(text, "NOT_FOUND") {
		t.Errorf("outbox ls:\n%s", text)
	}
	// Columns are aligned: every row's STATUS starts where the header's does.
	col := strings.Index(lines[0], "STATUS")
	for _, l := range lines[1:] {
		if s := strings.TrimSpace(l[col:min(col+9, len(l))]); s != "pending" && s != "parked" && s != "delivered" {
			t.Errorf("misaligned row %q (status column at %d)", l, col)
		}
	}
	parked := decode[[]view.OutboxRow](t, ok(t, cmd("outbox", "ls", "--status", "parked", "--json")...))
	if len(parked) != 1 || parked[0].MessageID != "out-3" || parked[0].Attempts != 1 || parked[0].Headers["tenant"] != "acme" {
		t.Fatalf("parked rows = %+v", parked)
	}
	page := decode[[]view.OutboxRow](t, ok(t, cmd("outbox", "ls", "--json", "--limit", "1", "--after-id", "0")...))
	if len(page) != 1 || page[0].MessageID != "out-1" {
		t.Errorf("first page = %+v", page)
	}

	unprocessed := decode[[]view.InboxEntry](t, ok(t, cmd("inbox", "ls", "--processed=false", "--json")...))
	if len(unprocessed) != 1 || unprocessed[0].MessageID != "in-4" || unprocessed[0].State != "locked" {
		t.Errorf("unprocessed entries = %+v", unprocessed)
	}
	text = ok(t, append([]string{"inbox", "show", "in-2"}, common...)...)
	if !strings.Contains(text, "in-2") || !strings.Contains(text, "billing") || !strings.Contains(text, "processed") {
		t.Errorf("inbox show:\n%s", text)
	}
	// Flags after the positional argument work too.
	if text := ok(t, "inbox", "show", "in-2", "--json", "--dsn", dsn, "--prefix", prefix); !strings.HasPrefix(text, "[") {
		t.Errorf("inbox show --json after the id: %s", text)
	}

	if text := ok(t, cmd("outbox", "requeue", "--all-parked")...); !strings.Contains(text, "requeued 1") {
		t.Errorf("requeue: %s", text)
	}
	if code, _, _ := barewire(t, cmd("outbox", "requeue")...); code != exitUsage {
		t.Errorf("requeue without ids = %d; want usage error", code)
	}

	time.Sleep(20 * time.Millisecond) // rows are older than --older-than 0s by the database clock
	if text := ok(t, cmd("inbox", "purge", "--older-than", "7d")...); !strings.Contains(text, "deleted 0") {
		t.Errorf("purge of recent entries: %s", text)
	}
	if text := ok(t, cmd("inbox", "purge", "--older-than", "0s", "--dry-run")...); !strings.Contains(text, "3 processed entries") || !strings.Contains(text, "dry run") {
		t.Errorf("dry run: %s", text)
	}
	code, out, errOut := barewire(t, cmd("inbox", "purge", "--older-than", "0s", "--batch", "1")...)
	if code != 0 || !strings.Contains(out, "deleted 3 processed entries") || !strings.Contains(out, "4 batch(es)") {
		t.Fatalf("inbox purge = %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "100% 3/3 rows") || !strings.Contains(errOut, "[##########") {
		t.Errorf("no progress on stderr:\n%s", errOut)
	}
	st = decode[statsJSON](t, ok(t, cmd("stats", "--json")...))
	if st.Inbox.Locked != 1 {
		t.Errorf("after inbox purge: %+v; the locked entry must stay", st.Inbox)
	}

	res := decode[purgeResult](t, ok(t, cmd("outbox", "purge", "--older-than", "0s", "--json")...))
	if res.Deleted != 2 || res.IncludePending {
		t.Errorf("outbox purge = %+v; want the 2 delivered rows", res)
	}
	code, _, errOut = barewire(t, cmd("outbox", "purge", "--older-than", "0s", "--include-pending")...)
	if code != exitUsage || !strings.Contains(errOut, "--yes") {
		t.Errorf("--include-pending without --yes = %d %q; want a refusal", code, errOut)
	}
	st = decode[statsJSON](t, ok(t, cmd("stats", "--json")...))
	if st.Outbox.Pending != 2 {
		t.Fatalf("pending rows touched without --yes: %+v", st.Outbox)
	}
	res = decode[purgeResult](t, ok(t, cmd("outbox", "purge", "--older-than", "0s", "--include-pending", "--yes", "--json")...))
	if res.Deleted != 2 || !res.IncludePending {
		t.Errorf("purge --include-pending --yes = %+v; want the 2 pending rows", res)
	}
	res = decode[purgeResult](t, ok(t, cmd("inbox", "purge", "--older-than", "0s", "--include-pending", "--yes", "--json")...))
	if res.Deleted != 1 {
		t.Errorf("inbox purge --include-pending --yes = %+v; want the locked entry", res)
	}
	st = decode[statsJSON](t, ok(t, cmd("stats", "--json")...))
	if st.Outbox != (struct{ Pending, Parked int64 }{}) || st.Inbox != (struct{ Locked, Expired int64 }{}) {
		t.Errorf("tables not empty: %+v", st)
	}
}

func TestCLINeverPrintsPassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:s3cr%21tpw@127.0.0.1:1/app?sslmode=disable",
		"host=127.0.0.1 port=1 user=app password=s3cr!tpw dbname=app sslmode=disable",
		"host=127.0.0.1 port=1 user=app password='s3cr!tpw' dbname=app sslmode=disable",
	} {
		code, out, errOut := barewire(t, "stats", "--dsn", dsn)
		if code != exitError {
			t.Errorf("%s: exit %d; want 1", redactDSN(dsn), code)
		}
		for _, leak := range []string{"s3cr!tpw", "s3cr%21tpw"} {
			if strings.Contains(out+errOut, leak) {
				t.Errorf("password printed: %s %s", out, errOut)
			}
		}
	}
	code, _, errOut := barewire(t, "stats", "--dsn", "mysql://root:hunter22@db/app")
	if code != exitUsage || strings.Contains(errOut, "hunter22") || !strings.Contains(errOut, "xxxxx") {
		t.Errorf("unknown DSN = %d %q", code, errOut)
	}
}

func TestCLIDSNForms(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ dsn, dialect, path string }{
		{"postgres://u:p@h/db", "postgres", ""},
		{"postgresql://h/db", "postgres", ""},
		{"host=127.0.0.1 user=postgres dbname=test sslmode=disable", "postgres", ""},
		{"sqlite:/var/lib/bus.sqlite", "sqlite", "/var/lib/bus.sqlite"},
		{"/tmp/bus.db", "sqlite", "/tmp/bus.db"},
	} {
		d, p, err := dsnDialect(c.dsn)
		if err != nil || d != c.dialect || p != c.path {
			t.Errorf("dsnDialect(%q) = %q %q %v; want %q %q", c.dsn, d, p, err, c.dialect, c.path)
		}
	}
	for dsn, want := range map[string]string{
		"postgres://app:pw@h:5432/db":        "postgres://app:xxxxx@h:5432/db",
		"host=h password=pw dbname=d":        "host=h password=xxxxx dbname=d",
		"host=h password='p w\\'x' dbname=d": "host=h password=xxxxx dbname=d",
		"host=h dbname=d":                    "host=h dbname=d",
	} {
		if got := redactDSN(dsn); got != want {
			t.Errorf("redactDSN(%q) = %q; want %q", dsn, got, want)
		}
	}
	if p := dsnPassword(`host=h password='p w\'x'`); p != "p w'x" {
		t.Errorf("quoted password = %q", p)
	}
}

func TestCLIUsageAndMigrationSQL(t *testing.T) {
	t.Parallel()
	if code, _, errOut := barewire(t); code != exitUsage || !strings.Contains(errOut, "Usage:") {
		t.Errorf("no args = %d %q", code, errOut)
	}
	if code, _, _ := barewire(t, "inbox", "frobnicate"); code != exitUsage {
		t.Errorf("unknown subcommand = %d", code)
	}
	out := ok(t, "migrate", "--print", "--dialect", "sqlite", "--prefix", "svc_")
	if !strings.Contains(out, "CREATE TABLE IF NOT EXISTS svc_inbox") || strings.Contains(out, "barewire_inbox") {
		t.Errorf("migrate --print:\n%s", out)
	}
	if d, err := parseAge("1.5d"); err != nil || d != 36*time.Hour {
		t.Errorf("parseAge(1.5d) = %v %v", d, err)
	}
	if _, err := parseAge("-1h"); err == nil {
		t.Error("negative age accepted")
	}
}

func TestCLIEnvDSNNeverPrinted(t *testing.T) { // not parallel: it sets the environment
	t.Setenv("BAREWIRE_DSN", "postgres://app:envs3cret@127.0.0.1:1/app?connect_timeout=1")
	for _, args := range [][]string{{"stats", "-h"}, {"stats"}, {"outbox", "ls", "--limit", "0"}} {
		_, out, errOut := barewire(t, args...)
		if strings.Contains(out+errOut, "envs3cret") {
			t.Errorf("barewire %v printed the password from BAREWIRE_DSN:\n%s%s", args, out, errOut)
		}
	}
	if code, _, errOut := barewire(t, "stats"); code != exitError || !strings.Contains(errOut, "connect") {
		t.Errorf("stats with BAREWIRE_DSN = %d %q; want a connection error", code, errOut)
	}
}

// TestCLIScheduled: outbox ls --scheduled lists only rows waiting for a
// future due time, with their DUE column.
func TestCLIScheduled(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bus.db")
	ok(t, "migrate", "--dsn", "sqlite:"+path)
	db, err := gormstore.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	store, err := gormstore.New(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = db.Transaction(func(tx *gorm.DB) error {
		return store.Outbox().Add(gormstore.WithTx(ctx, tx), []*outbox.Message{
			{MessageID: "now", Destination: "queue:reminders", Payload: []byte(`{}`)},
			{MessageID: "later", Destination: "queue:reminders", Payload: []byte(`{}`), Delay: time.Hour},
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	rows := decode[[]view.OutboxRow](t, ok(t, "outbox", "ls", "--scheduled", "--json", "--dsn", path))
	if len(rows) != 1 || rows[0].MessageID != "later" || rows[0].AvailableAt == nil || time.Until(*rows[0].AvailableAt) < 50*time.Minute {
		t.Fatalf("outbox ls --scheduled = %+v; want the one row due in an hour", rows)
	}
	text := ok(t, "outbox", "ls", "--scheduled", "--dsn", path)
	if !strings.Contains(text, "DUE") || !strings.Contains(text, "later") || strings.Contains(text, " now ") {
		t.Errorf("outbox ls --scheduled:\n%s", text)
	}
}

// TestCLIHelpVersionAndMissingIDs: every command answers --help with the
// usage (exit 0; "barewire inbox --help" said "unknown command"), version
// prints the build, and requeueing an id that is not a parked row exits
// non-zero saying so (it printed "requeued 0" and exited 0).
func TestCLIHelpVersionAndMissingIDs(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"inbox", "--help"}, {"outbox", "-h"}, {"outbox", "requeue", "--help"}, {"saga", "help"}, {"stats", "--help"}} {
		if out := ok(t, args...); !strings.Contains(out, "Usage:") {
			t.Errorf("barewire %s: no usage:\n%s", strings.Join(args, " "), out)
		}
	}
	if out := ok(t, "version"); !strings.HasPrefix(out, "barewire ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: %q", out)
	}
	path := filepath.Join(t.TempDir(), "bus.db")
	ok(t, "migrate", "--dsn", path)
	code, _, errOut := barewire(t, "outbox", "requeue", "99", "--dsn", path)
	if code != exitError || !strings.Contains(errOut, "1 of the 1 ids given are not parked outbox rows") {
		t.Errorf("requeue of a missing id = %d %q; want exit %d saying so", code, errOut, exitError)
	}
	if code, _, errOut := barewire(t, "inbox", "show", "nope", "--dsn", path); code != exitError || !strings.Contains(errOut, `no inbox entry for message id "nope"`) {
		t.Errorf("inbox show of a missing id = %d %q; want exit %d saying so", code, errOut, exitError)
	}
}

// TestCLIInboxRelease: an operator releases a lock left by a delivery that
// will never finish; the next delivery takes the entry at once. Releasing
// what holds no lock exits 1 and changes nothing.
func TestCLIInboxRelease(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bus.db")
	ok(t, "migrate", "--dsn", path)
	db, err := gormstore.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	s, err := gormstore.New(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k := inbox.Key{MessageID: "stuck", ConsumerType: "billing"}
	if l, err := s.Inbox().TryLock(ctx, k, time.Hour); err != nil || l.State != inbox.Acquired {
		t.Fatalf("lock: %+v, %v", l, err)
	}
	if code, _, _ := barewire(t, "inbox", "release", "stuck", "--dsn", path); code != exitUsage {
		t.Errorf("release without --consumer-type = %d; want a usage error", code)
	}
	if out := ok(t, "inbox", "release", "stuck", "--consumer-type", "billing", "--dsn", path); !strings.Contains(out, "released the lock of stuck/billing") {
		t.Errorf("release: %q", out)
	}
	l, err := s.Inbox().TryLock(ctx, k, time.Hour)
	if err != nil || l.State != inbox.Acquired {
		t.Fatalf("lock after the release: %+v, %v; want acquired at once", l, err)
	}
	if err := s.Inbox().Process(ctx, k, l.Token, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := barewire(t, "inbox", "release", "stuck", "--consumer-type", "billing", "--dsn", path); code != exitError || !strings.Contains(errOut, "nothing released") {
		t.Errorf("release of a processed entry = %d %q; want exit %d", code, errOut, exitError)
	}
}
