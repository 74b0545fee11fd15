package testenv

import (
	"net"
	"strings"

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

// PostgresAddr returns the host:port of dsn, a keyword/value DSN
// ("host=... port=..."), with PostgreSQL's defaults for what it omits.
func PostgresAddr(dsn string) string {
	return net.JoinHostPort(dsnField(dsn, "host", "127.0.0.1"), dsnField(dsn, "port", "5432"))
}

// PostgresDSNVia returns dsn with its host and port replaced by those of
// addr (a proxy's host:port).
func PostgresDSNVia(dsn, addr string) string {
	h, p, _ := net.SplitHostPort(addr)
	return replaceDSNField(replaceDSNField(dsn, "host", h), "port", p)
}

func dsnField(dsn, key, def string) string {
	for _, f := range strings.Fields(dsn) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return def
}

func replaceDSNField(dsn, key, val string) string {
	fields := strings.Fields(dsn)
	found := false
	for i, f := range fields {
		if strings.HasPrefix(f, key+"=") {
			fields[i], found = key+"="+val, true
		}
	}
	if !found {
		fields = append(fields, key+"="+val)
	}
	return strings.Join(fields, " ")
}
