package rabbitmq

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/barewire-go/barewire/endpoint"
	"github.com/barewire-go/barewire/outbox"
)

// testPKI is a throw-away CA with a server certificate for 127.0.0.1 and
// localhost, and a client certificate.
type testPKI struct {
	roots  *x509.CertPool
	server tls.Certificate
	client tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "barewire test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, usage x509.ExtKeyUsage, name string) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	return &testPKI{
		roots:  roots,
		server: leaf(2, x509.ExtKeyUsageServerAuth, "localhost"),
		client: leaf(3, x509.ExtKeyUsageClientAuth, "barewire-client"),
	}
}

// tlsProxy terminates TLS (requiring a client certificate signed by the
// test CA) in front of the test broker, so that amqps:// can be tested
// against a broker that only listens in plain AMQP.
type tlsProxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int32 // connections whose TLS handshake succeeded
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startTLSProxy(t *testing.T, pki *testPKI, target string) *tlsProxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{pki.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pki.roots,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsProxy{ln: ln, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *tlsProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.pipe(c.(*tls.Conn)) })
	}
}

func (p *tlsProxy) pipe(c *tls.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Handshake(); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	p.accepted.Add(1)
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	p.mu.Lock()
	p.conns = append(p.conns, c, up)
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
}

// amqpsURL turns the test broker URL into an amqps:// URL to the proxy.
func amqpsURL(t *testing.T, host string, p *tlsProxy) (string, string) {
	t.Helper()
	u, err := url.Parse(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	if !strings.Contains(target, ":") {
		target += ":5672"
	}
	u.Scheme = "amqps"
	if p != nil {
		_, port, _ := net.SplitHostPort(p.ln.Addr().String())
		u.Host = net.JoinHostPort(host, port)
	}
	return u.String(), target
}

// TestTLSConfig: RabbitMQ.TLS is what an amqps:// connection uses — its
// roots verify the server, its client certificate is presented — and
// without it (system roots, no client certificate) the connection is
// refused, with an error that names the cause and no password.
func TestTLSConfig(t *testing.T) {
	pki := newTestPKI(t)
	_, target := amqpsURL(t, "", nil)
	proxy := startTLSProxy(t, pki, target)
	rawURL, _ := amqpsURL(t, "localhost", proxy)

	queue := uniq("tls")
	pl := newPlain(t)
	pl.cleanupQueues(queue, queue+"_error")
	ep := newEndpoint(t, queue, nil, nil)

	dial := func(cfg *Config) (*Transport, error) {
		cfg.ConnectTimeout = 2 * time.Second
		cfg.ReconnectMaxInterval = time.Second
		tr, err := open(rawURL, cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := tr.Start(ctx, []*endpoint.Endpoint{ep}); err != nil {
			_ = tr.Close()
			return nil, err
		}
		return tr, nil
	}

	t.Run("roots and client certificate", func(t *testing.T) {
		tr, err := dial(&Config{TLS: &tls.Config{RootCAs: pki.roots, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12}})
		if err != nil {
			t.Fatalf("start over TLS: %v", err)
		}
		defer tr.Close()
		if proxy.accepted.Load() == 0 {
			t.Fatal("connected without a TLS handshake at the proxy")
		}
		msg := &outbox.Message{MessageID: "tls-1", Destination: "queue:" + queue, Payload: []byte(`{}`)}
		if errs := tr.Deliver(context.Background(), []*outbox.Message{msg}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if d := pl.get(queue); d.MessageId != "tls-1" {
			t.Fatalf("got %q through the TLS connection", d.MessageId)
		}
	})

	// An untrusted server certificate is a configuration error: Start
	// fails at the first attempt instead of retrying until ConnectTimeout.
	// A refusal by the server (no client certificate) is retried.
	for _, c := range []struct {
		name string
		cfg  *tls.Config
		want []string
	}{
		{"system roots do not trust the server", nil, []string{"after 1 attempt(s)", "unknown authority"}},
		// With TLS 1.3 the server's refusal can arrive after the client
		// thinks the handshake is done, so the client's error varies; the
		// proxy's count of accepted handshakes says it was refused.
		{"no client certificate", &tls.Config{RootCAs: pki.roots, MinVersion: tls.VersionTLS12}, nil},
		{"wrong server name", &tls.Config{RootCAs: pki.roots, Certificates: []tls.Certificate{pki.client}, ServerName: "broker.example", MinVersion: tls.VersionTLS12},
			[]string{"after 1 attempt(s)", "not broker.example"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			accepted := proxy.accepted.Load()
			_, err := dial(&Config{TLS: c.cfg})
			if n := proxy.accepted.Load(); n != accepted {
				t.Errorf("the proxy completed %d handshakes; want none", n-accepted)
			}
			if err == nil {
				t.Fatal("connected; want a TLS failure")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "guest:guest") {
				t.Errorf("error leaks the password: %q", err)
			}
		})
	}
}
