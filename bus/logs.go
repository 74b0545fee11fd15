package bus

import (
	"context"
	"log/slog"
)

// watermillHandler adapts Watermill's log records to the bus's attribute
// names (message_uuid → message_id, handler_name → handler) and demotes
// "Handler returned error": the handler's errors are nacks (inbox busy,
// shutdown) that the bus itself logs where they matter.
type watermillHandler struct{ next slog.Handler }

func (h watermillHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h watermillHandler) Handle(ctx context.Context, r slog.Record) error {
	level := r.Level
	if r.Message == "Handler returned error" && level > slog.LevelDebug {
		level = slog.LevelDebug
		if !h.next.Enabled(ctx, level) {
			return nil
		}
	}
	out := slog.NewRecord(r.Time, level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(renameWatermillAttr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h watermillHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	renamed := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		renamed[i] = renameWatermillAttr(a)
	}
	return watermillHandler{h.next.WithAttrs(renamed)}
}

func (h watermillHandler) WithGroup(name string) slog.Handler {
	return watermillHandler{h.next.WithGroup(name)}
}

func renameWatermillAttr(a slog.Attr) slog.Attr {
	switch a.Key {
	case "message_uuid":
		a.Key = "message_id"
	case "handler_name":
		a.Key = "handler"
	case "err":
		a.Key = "error"
	}
	return a
}
