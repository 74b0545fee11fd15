package reliability

import (
	"errors"
	"net/url"

	"github.com/barewire-go/barewire/internal/tcpproxy"
)

// Each consumer process reaches its server through a tcpproxy.Proxy of its
// own. It lets the harness cut that process's connections at the TCP level
// even while the process is frozen (SIGSTOP): the broker sees the
// connection drop at once and requeues the process's unacknowledged
// messages, which rabbitmqctl close_connection cannot achieve against a
// frozen client (the broker then waits for the client's close-ok).

// proxiedURL returns rawURL with its host and port replaced by the proxy's.
func proxiedURL(p *tcpproxy.Proxy, rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", errors.New("reliability: cannot parse the server URL") // never quote it: it may hold a password
	}
	u.Host = p.Addr()
	return u.String(), nil
}
