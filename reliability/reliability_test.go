//go:build linux

package reliability_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/barewire-go/barewire/internal/testenv"
	"github.com/barewire-go/barewire/reliability"
)

// TestReliability runs a fault-injection profile end to end (see package
// reliability): the short one by default, the long one with
// BAREWIRE_RELIABILITY_PROFILE=long. It fails on any lost, doubled or
// phantom effect, on dead letters, and on anything left undelivered.
//
// BAREWIRE_RELIABILITY_SUMMARY names a file that receives the summary (the
// Makefile prints it last); BAREWIRE_RELIABILITY_LOGDIR keeps the
// processes' logs there instead of in a temporary directory.
func TestReliability(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite: runs without -short")
	}
	skipPoison(t)
	dsn := testenv.PostgresDSN(t)
	url := testenv.AMQPURL(t)
	prof, err := reliability.ProfileFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	runProfile(t, prof, reliability.Env{
		PostgresDSN: dsn,
		AMQPURL:     url,
		Broker:      &reliability.Broker{URL: url, Ctl: reliability.DefaultRabbitmqctl()},
	})
}

// TestReliabilityPostgresTransport runs the same profile (short by default,
// long with BAREWIRE_RELIABILITY_PROFILE=long) on the PostgreSQL transport
// (reliability.ForPostgresTransport: fewer messages in the short profile,
// db-close instead of broker-close, no relay traffic to fault), with the
// same failure criteria, plus an empty outbox: every publish must have
// written its queue row in its own transaction. It needs no broker.
//
// It is not parallel: it and TestReliability may each restart PostgreSQL,
// and run one after the other.
func TestReliabilityPostgresTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite: runs without -short")
	}
	skipPoison(t)
	dsn := testenv.PostgresDSN(t)
	prof, err := reliability.ProfileFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	runProfile(t, reliability.ForPostgresTransport(prof), reliability.Env{PostgresDSN: dsn})
}

// TestPoison runs the poison profile on RabbitMQ + PostgreSQL (the short
// one, PoisonShortProfile; with BAREWIRE_RELIABILITY_PROFILE=poison,
// PoisonProfile): good traffic in a baseline, a poison and a second
// baseline phase, every poison class of workload.PoisonClasses mixed into
// the middle one. Beside the exactly-once checker it fails on any poison
// verdict of CheckPoison's report (see EvaluatePoison).
func TestPoison(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite: runs without -short")
	}
	dsn := testenv.PostgresDSN(t)
	url := testenv.AMQPURL(t)
	runProfile(t, reliability.PoisonProfileFromEnv(), reliability.Env{
		PostgresDSN: dsn,
		AMQPURL:     url,
		Broker:      &reliability.Broker{URL: url, Ctl: reliability.DefaultRabbitmqctl()},
	})
}

// TestPoisonPostgresTransport is TestPoison on the PostgreSQL transport
// (no raw AMQP classes).
func TestPoisonPostgresTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite: runs without -short")
	}
	dsn := testenv.PostgresDSN(t)
	runProfile(t, reliability.ForPostgresTransport(reliability.PoisonProfileFromEnv()), reliability.Env{PostgresDSN: dsn})
}

// runProfile completes env (service binary, logs, PostgreSQL restart
// command), runs prof and fails the test on any problem the run reports.
func runProfile(t *testing.T, prof reliability.Profile, env reliability.Env) {
	t.Helper()
	env.Bin = serviceBinary(t)
	logDir := os.Getenv("BAREWIRE_RELIABILITY_LOGDIR")
	if logDir == "" {
		logDir = t.TempDir()
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	env.LogDir = logDir
	env.PGRestart = reliability.DefaultPGRestart()
	env.Logf = t.Logf
	env.Keep = os.Getenv("BAREWIRE_RELIABILITY_KEEP") != ""
	timeout := prof.LoadTimeout + prof.DrainTimeout + 3*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := reliability.Run(ctx, env, prof)
	if res != nil {
		summary := res.Summary()
		t.Log("\n" + summary)
		if path := os.Getenv("BAREWIRE_RELIABILITY_SUMMARY"); path != "" {
			if werr := os.WriteFile(path, []byte(summary), 0o644); werr != nil {
				t.Error(werr)
			}
		}
		if len(res.Failures()) > 0 {
			for _, ps := range res.Procs {
				if len(ps.ErrorLines) > 0 {
					t.Logf("last errors of %s:\n%s", ps.Name, strings.Join(ps.ErrorLines, "\n"))
				}
			}
			t.Logf("process logs: %s", filepath.Clean(logDir))
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if f := res.Failures(); len(f) > 0 {
		t.Fatalf("%d problems:\n%s", len(f), strings.Join(f, "\n"))
	}
}

// skipPoison skips the fault profiles when BAREWIRE_RELIABILITY_PROFILE
// asks for the poison one (TestPoison runs it).
func skipPoison(t *testing.T) {
	if v := os.Getenv("BAREWIRE_RELIABILITY_PROFILE"); strings.HasPrefix(v, "poison") {
		t.Skipf("BAREWIRE_RELIABILITY_PROFILE=%s: TestPoison and TestPoisonPostgresTransport run it", v)
	}
}
