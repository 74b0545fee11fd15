package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/barewire-go/barewire/inbox"
)

// Log messages the harness reads. They are part of the service's contract
// with package reliability; change them together.
const (
	msgReady            = "ready"
	msgStats            = "stats"
	msgProducerDone     = "producer done"
	msgKillAfterConfirm = "kill-after-confirm"
	msgFenced           = "inbox fencing refused a late commit"
)

// busRetryMsg is the bus's debug message for a failed attempt that will be
// retried (bus/consume.go). Its error attribute tells a fencing refusal
// (inbox.ErrLockLost) from other failures.
const busRetryMsg = "consumer failed; retrying per policy"

// fenceWatcher is a slog.Handler that writes records at or above level to
// next, and additionally watches the bus's debug records for a delivery
// whose inbox lock was taken over (inbox.ErrLockLost): it counts each one
// and logs it at info level, so that the harness can see the fencing happen
// without the service running at debug level.
type fenceWatcher struct {
	next   slog.Handler
	level  slog.Level
	fenced *atomic.Int64
	// reconnects counts the transports' "connection lost" warnings (a
	// RabbitMQ connection, the PostgreSQL transport's LISTEN session): the
	// poison profile requires none.
	reconnects *atomic.Int64
}

// connectionLost matches the transports' warnings when their connection
// drops (transport/rabbitmq, transport/pgtransport).
func connectionLost(msg string) bool { return strings.Contains(msg, "connection lost") }

func newLogger(w io.Writer, level slog.Level, fenced, reconnects *atomic.Int64) *slog.Logger {
	// The JSON handler itself passes everything at debug; fenceWatcher
	// applies the configured level.
	next := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})
	return slog.New(&fenceWatcher{next: next, level: level, fenced: fenced, reconnects: reconnects})
}

func (h *fenceWatcher) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= min(h.level, slog.LevelDebug)
}

func (h *fenceWatcher) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && connectionLost(r.Message) {
		h.reconnects.Add(1)
	}
	if r.Level < slog.LevelInfo && r.Message == busRetryMsg {
		var lost bool
		var id string
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "error":
				if err, ok := a.Value.Any().(error); ok && errors.Is(err, inbox.ErrLockLost) {
					lost = true
				} else if strings.Contains(a.Value.String(), inbox.ErrLockLost.Error()) {
					lost = true
				}
			case "message_id":
				id = a.Value.String()
			}
			return true
		})
		if lost {
			h.fenced.Add(1)
			nr := slog.NewRecord(r.Time, slog.LevelInfo, msgFenced, r.PC)
			nr.AddAttrs(slog.String("message_id", id))
			if err := h.next.Handle(ctx, nr); err != nil {
				return err
			}
		}
	}
	if r.Level < h.level {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *fenceWatcher) WithAttrs(as []slog.Attr) slog.Handler {
	return &fenceWatcher{next: h.next.WithAttrs(as), level: h.level, fenced: h.fenced, reconnects: h.reconnects}
}

func (h *fenceWatcher) WithGroup(name string) slog.Handler {
	return &fenceWatcher{next: h.next.WithGroup(name), level: h.level, fenced: h.fenced, reconnects: h.reconnects}
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}
