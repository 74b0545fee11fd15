//go:build linux

package reliability_test

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/bus"
	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/gormstore/postgresdb"
	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/reliability"
	"github.com/barewire-go/barewire/reliability/workload"
)

// secretForms returns the ways a password can show up in a log: as is, and
// escaped the ways URLs and queries escape it.
func secretForms(pw string) []string {
	forms := []string{pw, url.QueryEscape(pw), url.PathEscape(pw)}
	if u := url.UserPassword("u", pw).String(); strings.HasPrefix(u, "u:") {
		forms = append(forms, strings.TrimPrefix(u, "u:"))
	}
	return forms
}

// assertNoSecret fails when any form of any secret appears in out.
func assertNoSecret(t *testing.T, what string, out []byte, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		for _, f := range secretForms(s) {
			if i := bytes.Index(out, []byte(f)); i >= 0 {
				lo, hi := max(0, i-200), min(len(out), i+len(f)+50)
				t.Errorf("%s: a password appears in the logs (as %q):\n...%s...", what, f, out[lo:hi])
			}
		}
	}
}

// withDSNPassword returns dsn with password pw, in whichever form dsn is.
func withDSNPassword(dsn, pw string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return dsn
		}
		user := "postgres"
		if u.User != nil {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, pw)
		return u.String()
	}
	quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
	return dsn + " password=" + quoted
}

// dsnPassword returns the password already in dsn, if any.
func dsnPassword(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		pw, _ := u.User.Password()
		return pw
	}
	for _, f := range strings.Fields(dsn) {
		if v, ok := strings.CutPrefix(f, "password="); ok {
			return strings.Trim(v, "'")
		}
	}
	return ""
}

// TestServiceNeverLogsPasswords runs the test service with a RabbitMQ user
// created for the test (with a password full of URL-reserved characters)
// and a password-bearing PostgreSQL DSN, makes it produce, consume, relay,
// lose and regain its broker connection, fail to log in and fail to reach
// the database, and asserts that no password appears anywhere in what it
// logged.
func TestServiceNeverLogsPasswords(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	amqpURL := testenv.AMQPURL(t)
	ctl := reliability.DefaultRabbitmqctl()
	if len(ctl) == 0 {
		t.Skip("needs rabbitmqctl to create a user with a password (set BAREWIRE_TEST_RABBITMQCTL)")
	}
	bin := serviceBinary(t)
	ctx := context.Background()
	broker := &reliability.Broker{URL: amqpURL, Ctl: ctl}
	run := func(args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return exec.CommandContext(ctx, ctl[0], append(ctl[1:], args...)...).CombinedOutput()
	}

	sfx := randHex(4)
	user := "bwsec_" + sfx
	amqpPW := "Am#" + randHex(8) + "@:/%?&= q"
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal("cannot parse BAREWIRE_TEST_AMQP_URL")
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	if out, err := run("add_user", user, amqpPW); err != nil {
		t.Fatalf("rabbitmqctl add_user: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := run("delete_user", user); err != nil {
			t.Errorf("rabbitmqctl delete_user: %v: %s", err, out)
		}
	})
	if out, err := run("set_permissions", "-p", vhost, user, ".*", ".*", ".*"); err != nil {
		t.Fatalf("rabbitmqctl set_permissions: %v: %s", err, out)
	}
	u.User = url.UserPassword(user, amqpPW)
	secretURL := u.String()
	u.User = url.UserPassword(user, "Wrong#"+randHex(8)+"@/")
	wrongURL := u.String()
	wrongPW, _ := u.User.Password()

	// A password PostgreSQL checks when the DSN has one, otherwise one that
	// trust authentication ignores (the test environment's case).
	pgPW := dsnPassword(dsn)
	secretDSN := dsn
	if len(pgPW) < 4 {
		pgPW = "Pg#" + randHex(8) + ` sp'q\`
		secretDSN = withDSNPassword(dsn, pgPW)
	}
	secrets := []string{amqpPW, wrongPW, pgPW}

	names := workload.Names{Run: "sec-" + sfx, Prefix: "sec_" + sfx + "_"}
	db, err := postgresdb.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = workload.Drop(context.Background(), db, names)
		closeGorm(db)
		deleteTopology(t, amqpURL, append(names.Queues(), names.Queues()[0]+"_error", names.Queues()[1]+"_error", names.Queues()[2]+"_error"), names.Exchanges())
	})

	logDir := t.TempDir()
	args := []string{"-run", names.Run, "-table-prefix", names.Prefix, "-roles", "producer,consumer,relay",
		"-messages", "30", "-stats-interval", "200ms", "-start-timeout", "3s"}
	proc, err := reliability.StartProc(bin, logDir, reliability.ProcSpec{Name: "sec", Args: args,
		Env: []string{"BAREWIRE_AMQP_URL=" + secretURL, "BAREWIRE_POSTGRES_DSN=" + secretDSN}})
	if err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proc.WaitReady(waitCtx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the service to consume its 30 messages", func() bool {
		pr, err := reliability.ReadProgress(ctx, db, names)
		return err == nil && pr.Committed >= 30 && pr.Complete()
	})
	// Lose the broker connection: the reconnect logs name the URL.
	if n, err := broker.CloseConnections(ctx, proc.Pid(), "security test"); err != nil || n == 0 {
		t.Fatalf("closing the service's connections: %d closed, %v", n, err)
	}
	waitUntil(t, 30*time.Second, "the service to reconnect", func() bool {
		b, _ := os.ReadFile(filepath.Join(logDir, "sec.001.log"))
		return bytes.Count(b, []byte("rabbitmq reconnected")) >= 1
	})
	stopCtx, cancelStop := context.WithTimeout(ctx, 30*time.Second)
	defer cancelStop()
	if err := proc.Stop(stopCtx); err != nil {
		t.Error(err)
	}
	logs, err := os.ReadFile(filepath.Join(logDir, "sec.001.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(logs, []byte(`xxxxx@`)) || !bytes.Contains(logs, []byte("rabbitmq connection lost")) {
		t.Fatalf("the logs lack the redacted URL or the reconnect; was the service's output captured?\n%s", logs)
	}
	assertNoSecret(t, "running service", logs, secrets...)

	// Failures are where secrets leak most: a refused login and an
	// unreachable database, each with a password in the connection string.
	for _, tc := range []struct {
		name, amqp, dsn, want string
	}{
		{"wrong broker password", wrongURL, secretDSN, "(403)"},
		{"unreachable database", secretURL, withDSNPassword("host=127.0.0.1 port=1 user=postgres dbname=test sslmode=disable connect_timeout=2", pgPW), "failed"},
		{"unreachable database, URL form", secretURL, "postgres://postgres:" + url.QueryEscape(pgPW) + "@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "-run", names.Run, "-table-prefix", names.Prefix, "-roles", "consumer,relay", "-start-timeout", "2s")
			cmd.Env = append(os.Environ(), "BAREWIRE_AMQP_URL="+tc.amqp, "BAREWIRE_POSTGRES_DSN="+tc.dsn)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the service started with %s:\n%s", tc.name, out)
			}
			if !bytes.Contains(out, []byte(tc.want)) {
				t.Errorf("the failure does not say what went wrong (want %q):\n%s", tc.want, out)
			}
			assertNoSecret(t, tc.name, out, secrets...)
		})
	}
}

// TestTableNamesValidated checks that a table prefix that would not make
// plain SQL identifiers is rejected everywhere a prefix enters: the bus,
// the store, the migration text, the workload names and the service's
// command line. Prefixes are interpolated into SQL, so this validation is
// what keeps the SQL safe.
func TestTableNamesValidated(t *testing.T) {
	bad := []string{
		"bad-prefix_", "x; DROP TABLE y; --", "1abc_", `quote"d_`, "space d_", "ünï_",
		strings.Repeat("p", 50), "sqlite_", "tab\t_", "a.b_",
	}
	good := []string{"ok_", "Tenant42_", "_x_", strings.Repeat("p", 40)}
	db, err := gormstore.OpenSQLite("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeGorm(db) })
	for _, p := range bad {
		if _, err := bus.New(bus.WithDatabase(db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = p })); err == nil || !strings.Contains(err.Error(), "invalid table prefix") {
			t.Errorf("bus.New with prefix %q: %v; want an invalid table prefix error", p, err)
		}
		if _, err := bus.New(bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = p })); err == nil {
			t.Errorf("bus.New (embedded) with prefix %q: no error", p)
		}
		if _, err := gormstore.New(db, gormstore.WithTablePrefix(p)); err == nil {
			t.Errorf("gormstore.New with prefix %q: no error", p)
		}
		if _, err := gormstore.MigrationSQL(gormstore.DialectPostgres, p); err == nil {
			t.Errorf("gormstore.MigrationSQL with prefix %q: no error", p)
		}
		if err := (workload.Names{Run: "r", Prefix: p}).Validate(); err == nil {
			t.Errorf("workload names with prefix %q: no error", p)
		}
	}
	for _, p := range good {
		if _, err := bus.New(bus.WithDatabase(db), bus.WithOutbox(func(o *outbox.Options) { o.TablePrefix = p })); err != nil {
			t.Errorf("bus.New with valid prefix %q: %v", p, err)
		}
	}

	// The service refuses a bad prefix before it connects anywhere (the
	// connection strings point nowhere).
	bin := serviceBinary(t)
	for _, p := range []string{`evil"; DROP TABLE x; --`, "bad-prefix_"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, "-run", "r", "-table-prefix", p, "-roles", "consumer")
		cmd.Env = append(os.Environ(), "BAREWIRE_AMQP_URL=amqp://u:p@127.0.0.1:1/", "BAREWIRE_POSTGRES_DSN=host=127.0.0.1 port=1")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "invalid table prefix") {
			t.Errorf("service with prefix %q: %v\n%s", p, err, out)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("service with prefix %q took %v to refuse it; it should not try to connect", p, d)
		}
	}
}
