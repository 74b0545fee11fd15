package samples_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/barewire-go/barewire/internal/testenv"
)

// noDemo lists the sample programs that have no scripted -demo: deployment
// programs that need the services. Their own tests run them end to end.
var noDemo = map[string]bool{
	"standalone-relay": true, // an outbox relay only: PostgreSQL to RabbitMQ
}

// sampleDirs lists the sample programs with a -demo: the directories under
// samples/ with a main.go, except noDemo's.
func sampleDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && !noDemo[e.Name()] && fileExists(filepath.Join(e.Name(), "main.go")) {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) == 0 {
		t.Fatal("no sample directories found")
	}
	return dirs
}

// TestDemos runs every sample's scripted -demo on the embedded default (no
// services needed); each must exit 0.
func TestDemos(t *testing.T) {
	names := sampleDirs(t)
	bin := buildSamples(t)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out := runDemo(t, filepath.Join(bin, name))
			if !strings.Contains(out, " on in-process + SQLite") {
				t.Errorf("%s -demo does not say it runs on the embedded default:\n%s", name, out)
			}
		})
	}
}

// TestDemosOnServices runs every demo on RabbitMQ, with the inbox and
// outbox in PostgreSQL, one after the other. It needs
// BAREWIRE_TEST_AMQP_URL and BAREWIRE_TEST_POSTGRES_DSN.
func TestDemosOnServices(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (needs RabbitMQ and PostgreSQL); not run with -short")
	}
	url, dsn := testenv.AMQPURL(t), testenv.PostgresDSN(t)
	names := sampleDirs(t)
	bin := buildSamples(t)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			out := runDemo(t, filepath.Join(bin, name), "-amqp-url", url, "-postgres-dsn", isolatedDSN(t, dsn, name))
			if !strings.Contains(out, " on RabbitMQ + PostgreSQL") {
				t.Errorf("%s -demo does not say it runs on RabbitMQ + PostgreSQL:\n%s", name, out)
			}
		})
	}
}

// TestDemosOnPostgresTransport runs every demo with -transport postgres:
// the PostgreSQL transport, no broker, the queues, the inbox and the outbox
// in one database. It needs BAREWIRE_TEST_POSTGRES_DSN.
func TestDemosOnPostgresTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (needs PostgreSQL); not run with -short")
	}
	dsn := testenv.PostgresDSN(t)
	names := sampleDirs(t)
	bin := buildSamples(t)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			out := runDemo(t, filepath.Join(bin, name), "-transport", "postgres", "-postgres-dsn", isolatedDSN(t, dsn, name))
			if !strings.Contains(out, " on PostgreSQL transport") {
				t.Errorf("%s -demo does not say it runs on the PostgreSQL transport:\n%s", name, out)
			}
		})
	}
}

// TestDemosOnWatermillPresets runs the basic-publish-consume demo on each
// Watermill preset tested here (NATS JetStream, Redis Streams, RabbitMQ
// through watermill-amqp), with the inbox and outbox in PostgreSQL. It
// needs BAREWIRE_TEST_NATS_URL, BAREWIRE_TEST_REDIS_ADDR,
// BAREWIRE_TEST_AMQP_URL and BAREWIRE_TEST_POSTGRES_DSN.
func TestDemosOnWatermillPresets(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (needs NATS, Redis, RabbitMQ and PostgreSQL); not run with -short")
	}
	dsn := testenv.PostgresDSN(t)
	bin := filepath.Join(buildSamples(t), "basic-publish-consume")
	for _, tc := range []struct {
		transport string
		args      func(t *testing.T) []string
		says      string
	}{
		{"nats", func(t *testing.T) []string { return []string{"-nats-url", testenv.NATSURL(t)} }, " on NATS JetStream through watermill-nats + PostgreSQL"},
		{"redis", func(t *testing.T) []string { return []string{"-redis-addr", testenv.RedisAddr(t)} }, " on Redis Streams through watermill-redisstream + PostgreSQL"},
		{"wmamqp", func(t *testing.T) []string { return []string{"-amqp-url", testenv.AMQPURL(t)} }, " on RabbitMQ through watermill-amqp + PostgreSQL"},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			args := append([]string{"-transport", tc.transport, "-postgres-dsn", isolatedDSN(t, dsn, "basic-"+tc.transport)}, tc.args(t)...)
			out := runDemo(t, bin, args...)
			if !strings.Contains(out, tc.says) {
				t.Errorf("demo does not say %q:\n%s", tc.says, out)
			}
		})
	}
}

// TestTransportFlagErrors checks that a transport selection that cannot
// work stops a sample at once (exit status 2) with a message saying why.
func TestTransportFlagErrors(t *testing.T) {
	bin := filepath.Join(buildSamples(t), "basic-publish-consume")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-transport", "postgres"}, "-transport postgres needs -postgres-dsn"},
		{[]string{"-transport", "rabbitmq"}, "-transport rabbitmq needs -amqp-url"},
		{[]string{"-transport", "kafka"}, `-transport "kafka": use one of embedded, rabbitmq, postgres`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, append([]string{"-demo"}, tc.args...)...)
			cmd.Env = append(os.Environ(), clearedEnv...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("want exit status 2, got %v:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output does not say %q:\n%s", tc.want, out)
			}
		})
	}
}

// isolatedDSN returns dsn with search_path set to a schema of its own,
// created for this test and dropped (with every table the sample created
// in it) when the test ends: runs never see each other's tables, queue
// rows, bindings or inbox entries.
func isolatedDSN(t *testing.T, dsn, sampleName string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	defer conn.Close(context.Background())
	schema := "bwsample_" + strings.ReplaceAll(uuid.NewString()[:8]+"_"+sampleName, "-", "_")
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := neturl.Parse(dsn)
		if err != nil {
			t.Fatalf("parse DSN: %v", err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " search_path=" + schema
}

// built holds the sample binaries, built once for all tests.
var built struct {
	once sync.Once
	dir  string
	err  error
}

// TestMain removes the binaries after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildSamples builds every sample into a temporary directory with one go
// build (the first time it is called) and returns the directory.
func buildSamples(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "barewire-samples-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		// go test puts its own GOROOT/bin first in PATH: this is the same go.
		cmd := exec.Command("go", "build", "-o", dir, "./...")
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build -o %s ./... (in samples/): %w\n%s", dir, err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// clearedEnv clears the BAREWIRE_* variables that select services, so that
// only the arguments choose them.
var clearedEnv = []string{"BAREWIRE_TRANSPORT=", "BAREWIRE_AMQP_URL=", "BAREWIRE_POSTGRES_DSN=", "BAREWIRE_LISTEN="}

// runDemo runs bin -demo with args and fails the test unless it exits 0
// within two minutes; it returns what the demo printed.
func runDemo(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"-demo"}, args...)...)
	cmd.Env = append(os.Environ(), clearedEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s -demo did not finish within 2 minutes:\n%s", filepath.Base(bin), out.String())
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		t.Fatalf("%s -demo exited with %d:\n%s", filepath.Base(bin), exit.ExitCode(), out.String())
	case err != nil:
		t.Fatalf("run %s: %v", bin, err)
	}
	t.Logf("%s -demo passed in %v", filepath.Base(bin), time.Since(start).Round(time.Millisecond))
	return out.String()
}

// serviceClients are packages that a build with -tags embedded must not
// link: the transports' clients and the PostgreSQL driver.
var serviceClients = []string{
	"github.com/rabbitmq/amqp091-go",
	"github.com/jackc/pgx/v5",
	"github.com/nats-io/nats.go",
	"github.com/redis/go-redis/v9",
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp",
}

// TestEmbeddedBuild checks the README's main-job command: with -tags
// embedded the inbox-deduplication sample links no service client, its
// demo runs and tells what each delivery came to, and a selection that
// needs a service stops at once (exit status 2) saying how to build it.
func TestEmbeddedBuild(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "embedded", "-deps", "./inbox-deduplication").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	if !deps["github.com/glebarez/go-sqlite"] {
		t.Fatalf("go list -deps does not list the SQLite driver; the check below would prove nothing:\n%s", out)
	}
	for _, p := range serviceClients {
		if deps[p] {
			t.Errorf("built with -tags embedded, inbox-deduplication links %s", p)
		}
	}
	bin := filepath.Join(t.TempDir(), "inbox-deduplication")
	if out, err := exec.Command("go", "build", "-tags", "embedded", "-o", bin, "./inbox-deduplication").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags embedded: %v\n%s", err, out)
	}
	demo := runDemo(t, bin)
	if n := strings.Count(demo, " processed: the consumer ran"); n != 2 {
		t.Errorf("the demo tells %d processed deliveries; want 2:\n%s", n, demo)
	}
	if n := strings.Count(demo, " duplicate: the inbox already holds"); n != 5 {
		t.Errorf("the demo tells %d duplicates; want 5:\n%s", n, demo)
	}
	for _, args := range [][]string{{"-transport", "rabbitmq", "-amqp-url", "amqp://127.0.0.1:1/"}, {"-postgres-dsn", "host=127.0.0.1"}} {
		cmd := exec.Command(bin, append([]string{"-demo"}, args...)...)
		cmd.Env = append(os.Environ(), clearedEnv...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%v: want exit status 2, got %v:\n%s", args, err, out)
		}
		if !strings.Contains(string(out), "built with -tags embedded") {
			t.Errorf("%v: the error does not say the build left the service out:\n%s", args, out)
		}
	}
}
