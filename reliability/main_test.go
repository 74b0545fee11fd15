//go:build linux

package reliability_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/barewire-go/barewire/reliability"
)

// buildDir holds the service binary, built at most once per test binary run.
var (
	buildDir  string
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// serviceBinary builds cmd/barewire-testsvc once and returns its path.
func serviceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "barewire-reliability-")
		if buildErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		buildBin, buildErr = reliability.BuildService(ctx, buildDir)
		t.Logf("built %s in %s", reliability.ServicePackage, time.Since(start).Round(time.Millisecond))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}
