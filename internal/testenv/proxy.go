package testenv

import (
	"testing"

	"github.com/barewire-go/barewire/internal/tcpproxy"
)

// Proxy puts a TCP proxy in front of the server of rawURL, closed at the
// end of t, and returns it with rawURL rewritten to reach the server
// through it: the conformance suites' reconnect case cuts it.
func Proxy(t testing.TB, rawURL string) (*tcpproxy.Proxy, string) {
	t.Helper()
	px, proxied, err := tcpproxy.ForURL(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	return px, proxied
}
