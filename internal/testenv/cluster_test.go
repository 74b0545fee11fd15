package testenv

import (
	"path/filepath"
	"testing"
)

// TestClusterScriptFoundAbove: from this package's folder the script two
// levels up is found.
func TestClusterScriptFoundAbove(t *testing.T) {
	want, err := filepath.Abs(filepath.Join("..", "..", "scripts", "rabbitmq-cluster.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if got := ClusterScript(t); got != want {
		t.Fatalf("ClusterScript = %q; want %q", got, want)
	}
}
