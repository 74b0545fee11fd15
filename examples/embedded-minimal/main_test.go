package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "greetings received \"hello\"\n"; got != want {
		t.Errorf("printed %q, want %q", got, want)
	}
}

// TestLinksNoBrokerClientNorPostgresDriver: a service on the embedded
// default links neither RabbitMQ's client nor a PostgreSQL driver nor the
// PostgreSQL transport's watermill-sql.
func TestLinksNoBrokerClientNorPostgresDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, bad := range []string{"amqp091", "jackc/pgx", "lib/pq", "watermill-sql", "transport/rabbitmq", "transport/pgtransport"} {
			if strings.Contains(p, bad) {
				t.Errorf("links %s", p)
			}
		}
	}
}
