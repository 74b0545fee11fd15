package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// ClusterScript returns the path of scripts/rabbitmq-cluster.sh, found in
// the test's folder or one above it; the tests of AMQPClusterURLs' cluster
// stop and start its nodes with it.
func ClusterScript(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, "scripts", "rabbitmq-cluster.sh")
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("scripts/rabbitmq-cluster.sh not found above the test's folder")
		}
		dir = parent
	}
}
