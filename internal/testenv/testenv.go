package testenv

import (
	"os"
	"testing"
)

// Environment variables read by integration tests.
const (
	PostgresVar = "BAREWIRE_TEST_POSTGRES_DSN"
	AMQPVar     = "BAREWIRE_TEST_AMQP_URL"
)

// PostgresDSN returns the test PostgreSQL DSN or skips (fails under CI).
func PostgresDSN(t testing.TB) string {
	return get(t, PostgresVar, "host=127.0.0.1 user=postgres dbname=test sslmode=disable")
}

// AMQPURL returns the test RabbitMQ URL or skips (fails under CI).
func AMQPURL(t testing.TB) string { return get(t, AMQPVar, "amqp://guest:guest@127.0.0.1:5672/") }

func get(t testing.TB, name, example string) string {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		return v
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set, and integration tests must not skip under CI", name)
	}
	t.Skipf("integration test: set %s (e.g. %q) to run it", name, example)
	return ""
}
