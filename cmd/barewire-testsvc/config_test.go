package main

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// baseArgs are the arguments every case needs.
var baseArgs = []string{"-run", "rel-test", "-table-prefix", "rel_test_", "-postgres-dsn", "host=127.0.0.1 dbname=test"}

func TestTransportFlag(t *testing.T) {
	t.Setenv("BAREWIRE_AMQP_URL", "")
	t.Setenv("BWTESTSVC_TRANSPORT", "")

	// RabbitMQ is the default and needs its URL.
	if _, err := parseConfig(baseArgs); err == nil || !strings.Contains(err.Error(), "no RabbitMQ URL") {
		t.Fatalf("default transport without an AMQP URL: got %v, want the missing-URL error", err)
	}
	c, err := parseConfig(append(baseArgs, "-amqp-url", "amqp://guest:guest@127.0.0.1:5672/"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport != transportRabbitMQ {
		t.Fatalf("default transport %q, want rabbitmq", c.Transport)
	}

	// PostgreSQL needs no AMQP URL; the lease defaults to the inbox lock
	// timeout plus a second.
	c, err = parseConfig(append(baseArgs, "-transport", "postgres", "-inbox-lock-timeout", "2s"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport != transportPostgres || c.PGLease != 3*time.Second {
		t.Fatalf("got transport %q lease %v, want postgres 3s", c.Transport, c.PGLease)
	}

	// The environment selects it too; a flag wins over it.
	t.Setenv("BWTESTSVC_TRANSPORT", "postgres")
	if c, err = parseConfig(append(baseArgs, "-pg-lease", "1500ms")); err != nil || c.Transport != transportPostgres || c.PGLease != 1500*time.Millisecond {
		t.Fatalf("BWTESTSVC_TRANSPORT=postgres: got %+v, %v", c, err)
	}
	if _, err = parseConfig(append(baseArgs, "-transport", "rabbitmq")); err == nil {
		t.Fatal("-transport rabbitmq (over BWTESTSVC_TRANSPORT=postgres) without an AMQP URL was accepted")
	}

	for _, bad := range [][]string{
		{"-transport", "kafka"},
		{"-transport", "postgres", "-pg-lease", "50ms"},
		{"-transport", "postgres", "-pg-lease", "-1s"},
	} {
		_, err := parseConfig(append(append([]string{}, baseArgs...), bad...))
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		if bad[1] == "kafka" && !strings.Contains(err.Error(), `-transport "kafka": use rabbitmq, postgres, wmamqp, wmnats or wmredis`) {
			t.Errorf("%q: unclear error %v", bad, err)
		}
	}
}

// TestWatermillTransportFlag: each Watermill preset needs its server's
// address from the environment and a redelivery timeout of at least 100ms.
func TestWatermillTransportFlag(t *testing.T) {
	t.Setenv("BAREWIRE_AMQP_URL", "")
	t.Setenv("BAREWIRE_NATS_URL", "")
	t.Setenv("BAREWIRE_REDIS_ADDR", "")
	t.Setenv("BAREWIRE_POSTGRES_DSN", "host=127.0.0.1 dbname=test")
	base := []string{"-run", "rel-1", "-table-prefix", "rel_1_"}
	for tr, want := range map[string]string{
		"wmamqp":  "set BAREWIRE_AMQP_URL",
		"wmnats":  "set BAREWIRE_NATS_URL",
		"wmredis": "set BAREWIRE_REDIS_ADDR",
	} {
		if _, err := parseConfig(append(base, "-transport", tr)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("-transport %s without its address: %v, want an error saying %q", tr, err, want)
		}
	}
	t.Setenv("BAREWIRE_NATS_URL", "nats://127.0.0.1:4222")
	c, err := parseConfig(append(base, "-transport", "wmnats", "-wm-redelivery", "3s"))
	if err != nil || !isWatermill(c.Transport) || c.WMRedelivery != 3*time.Second {
		t.Fatalf("wmnats: got %+v, %v", c, err)
	}
	if _, err := parseConfig(append(base, "-transport", "wmnats", "-wm-redelivery", "10ms")); err == nil || !strings.Contains(err.Error(), "-wm-redelivery") {
		t.Errorf("-wm-redelivery 10ms: %v, want an error naming it", err)
	}
}

func TestWithApplicationName(t *testing.T) {
	name := `bwtestsvc rel-1 it's\x pid 7`
	for _, dsn := range []string{
		"host=127.0.0.1 user=postgres dbname=test sslmode=disable",
		"host=127.0.0.1 dbname=test application_name=other ",
		"postgres://postgres:secret@127.0.0.1:5432/test?sslmode=disable&application_name=other",
	} {
		got, err := withApplicationName(dsn, name)
		if err != nil {
			t.Fatalf("%q: %v", dsn, err)
		}
		cfg, err := pgconn.ParseConfig(got)
		if err != nil {
			t.Fatalf("%q: the result does not parse: %v", dsn, err)
		}
		if an := cfg.RuntimeParams["application_name"]; an != name {
			t.Errorf("%q: application_name %q, want %q", dsn, an, name)
		}
		if cfg.Database != "test" {
			t.Errorf("%q: database %q lost", dsn, cfg.Database)
		}
	}
}
