package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/outbox"
)

// A broker that stops reading a connection (a resource alarm blocks every
// connection that publishes; a partition that drops packets without
// resets) leaves the client waiting on two kinds of thing that amqp091
// does not bound: a socket write, once the buffers are full, and a
// synchronous call (channel open and close, a declaration, enabling
// confirms), whose reply never comes. Heartbeats do not end either while
// the broker still sends its own. The transport bounds both: every write
// by writeTimeout, every call by rpcTimeout; at either bound the
// connection is closed, which ends every wait on it, and the supervisor
// reconnects.

// writeBounded gives every Write on the broker connection a deadline of
// timeout from its start (or the deadline amqp091 set, the handshake's or
// CloseDeadline's, when that is sooner). A write that times out fails,
// and amqp091 closes the connection over it.
type writeBounded struct {
	net.Conn
	timeout time.Duration

	mu    sync.Mutex
	fixed time.Time // the deadline amqp091 set for writes; zero: none
}

func (c *writeBounded) SetDeadline(d time.Time) error {
	c.mu.Lock()
	c.fixed = d
	c.mu.Unlock()
	return c.Conn.SetDeadline(d)
}

func (c *writeBounded) SetWriteDeadline(d time.Time) error {
	c.mu.Lock()
	c.fixed = d
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(d)
}

func (c *writeBounded) Write(b []byte) (int, error) {
	d := time.Now().Add(c.timeout)
	c.mu.Lock()
	if !c.fixed.IsZero() && c.fixed.Before(d) {
		d = c.fixed
	}
	c.mu.Unlock()
	if err := c.Conn.SetWriteDeadline(d); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// writeTimeout bounds one socket write: PublishTimeout, the bound of the
// confirm a publish waits for after its write.
func (t *Transport) writeTimeout() time.Duration { return t.cfg.PublishTimeout }

// rpcTimeout bounds one synchronous call on the connection.
func (t *Transport) rpcTimeout() time.Duration { return t.cfg.PublishTimeout }

// closeTimeout bounds Close's connection.close handshake and its wait for
// the subscriptions to end before it closes the connection under them.
const closeTimeout = 5 * time.Second

// bounded runs fn, a synchronous call on conn, and waits for it at most
// rpcTimeout. A broker that leaves a call unanswered that long is not
// serving this connection: bounded closes the connection, which ends fn
// and every other wait on it, and returns an error that wraps
// outbox.ErrTransportUnavailable.
func (t *Transport) bounded(conn *amqp.Connection, what string, fn func() error) error {
	if err, answered := within(context.Background(), t.rpcTimeout(), fn); answered {
		return err
	}
	t.log.Warn("rabbitmq broker did not answer a call: closing the connection", slog.String("call", what), slog.Duration("timeout", t.rpcTimeout()))
	abandon(conn)
	return fmt.Errorf("%w: rabbitmq: %s: no answer from the broker within %v; connection closed", outbox.ErrTransportUnavailable, what, t.rpcTimeout())
}

// within runs fn, a synchronous call, and waits for it at most d, or
// until ctx ends: answered is false when fn was still running, and fn is
// then left to finish by itself.
func within(ctx context.Context, d time.Duration, fn func() error) (err error, answered bool) {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-done:
		return err, true
	case <-timer.C:
	case <-ctx.Done():
	}
	return nil, false
}

// abandon closes conn without waiting for the broker's close-ok longer
// than a second.
func abandon(conn *amqp.Connection) {
	go func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
}

// closeChannel closes ch in the background, bounded as a call: nothing
// waits for it.
func (t *Transport) closeChannel(conn *amqp.Connection, ch *amqp.Channel) {
	go func() { _ = t.bounded(conn, "close channel", ch.Close) }()
}

// isTimeout reports whether err is a deadline passing (a bounded write or
// close-ok wait), not a failure worth reporting from Close.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
