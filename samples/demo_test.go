package samples_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/barewire-go/barewire/internal/testenv"
)

// onServices lists the samples whose demo also runs on RabbitMQ and
// PostgreSQL. (inbox-deduplication's demo uses a fixed message id, so its
// outcome depends on what earlier runs left in a persistent database.)
var onServices = []string{
	"backpressure",
	"basic-publish-consume",
	"multi-consumer",
	"raw-message-interop",
	"retry-and-dlq",
	"transactional-outbox",
}

// sampleDirs lists the sample programs: the directories under samples/
// with a main.go.
func sampleDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && fileExists(filepath.Join(e.Name(), "main.go")) {
			dirs = append(dirs, e.Name())
		}
	}
	for _, name := range onServices {
		if !slices.Contains(dirs, name) {
			t.Errorf("onServices names %q, which is not a sample directory", name)
		}
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
			runDemo(t, filepath.Join(bin, name))
		})
	}
}

// TestDemosOnServices runs the demos on RabbitMQ and PostgreSQL, one after
// the other. It needs BAREWIRE_TEST_AMQP_URL and BAREWIRE_TEST_POSTGRES_DSN.
func TestDemosOnServices(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test (needs RabbitMQ and PostgreSQL); not run with -short")
	}
	url, dsn := testenv.AMQPURL(t), testenv.PostgresDSN(t)
	bin := buildSamples(t)
	for _, name := range onServices {
		t.Run(name, func(t *testing.T) {
			runDemo(t, filepath.Join(bin, name), "-amqp-url", url, "-postgres-dsn", dsn)
		})
	}
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

// runDemo runs bin -demo with args and fails the test unless it exits 0
// within two minutes. The BAREWIRE_* variables that select services are
// cleared, so that only args choose them.
func runDemo(t *testing.T, bin string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"-demo"}, args...)...)
	cmd.Env = append(os.Environ(), "BAREWIRE_AMQP_URL=", "BAREWIRE_POSTGRES_DSN=", "BAREWIRE_LISTEN=")
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
}
