package bus

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/barewire-go/barewire/internal/wire"
)

// FuzzEnvelope: whatever headers, id and destination a caller passes, the
// publish path either refuses with ErrInvalidMessage (or ErrMessageTooLarge)
// or builds a message every transport and store can carry, checked here
// independently of wire.Validate. Run: go test -fuzz FuzzEnvelope ./bus/
func FuzzEnvelope(f *testing.F) {
	long := strings.Repeat("x", 300)
	for _, s := range [][6]string{
		{"id-1", "corr", "Order", "tenant", "acme", ""},
		{"", long, "Order", "k", "v", ""},
		{"a\x00b", "", "", "k", "v", "queue:q"},
		{"\x9f\x12\xfe", "\xff", "Order", "k", "\xfe", "exchange:x"},
		{strings.Repeat("i", 201), "", "", long, "v", ""},
		{"id", "", long, "k", strings.Repeat("v", 70000), ""},
		{"id", "", "", "correlation-id", long, "queue:" + long},
		{"id", "", "", "BW-RoutingKey", long, ""},
		{"id", "", "", "content-type", "\x00", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	b, err := New(WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, corr, typ, hk, hv, dest string) {
		h := Headers{HeaderMessageID: id, HeaderCorrelationID: corr, HeaderMessageType: typ, hk: hv}
		m, _, err := b.envelope(dest, Raw{Type: "T", Body: []byte("x")}, h)
		if err != nil {
			if !errors.Is(err, ErrInvalidMessage) && !errors.Is(err, ErrMessageTooLarge) {
				t.Fatalf("refused with an unclassified error: %v", err)
			}
			return
		}
		storable := func(field, v string, max int) {
			if max > 0 && len(v) > max {
				t.Fatalf("accepted %s of %d bytes (limit %d)", field, len(v), max)
			}
			if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
				t.Fatalf("accepted %s %q that PostgreSQL cannot store", field, v)
			}
		}
		storable("message id", m.MessageID, wire.MaxMessageIDLen)
		for field, v := range map[string]string{"correlation id": m.CorrelationID, "type": m.MessageType,
			"content type": m.ContentType, "routing key": m.RoutingKey} {
			storable(field, v, wire.MaxShortString)
		}
		_, name := wire.ParseDestination(m.Destination)
		storable("destination", name, wire.MaxShortString)
		size := 0
		for k, v := range m.Headers {
			storable("header key", k, wire.MaxShortString)
			storable("header value", v, 0)
			size += len(k) + len(v)
		}
		if size > wire.MaxHeaderBytes {
			t.Fatalf("accepted %d bytes of headers", size)
		}
	})
}
