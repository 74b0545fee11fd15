package wire

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/barewire-go/barewire/outbox"
)

// Limits of what the transports and the stores can carry.
const (
	// MaxShortString is the AMQP 0-9-1 limit of a short string: message
	// type, content type, correlation id, exchange and routing-key names,
	// header keys. amqp091 closes the whole connection on a longer one.
	MaxShortString = 255
	// MaxMessageIDLen bounds message ids so that they fit the inbox key.
	MaxMessageIDLen = 200
	// MaxHeaderBytes bounds the encoded size of a message's properties and
	// headers at publish: they travel in one AMQP frame, and RabbitMQ's
	// frame_max is 128 KiB by default (4 KiB at the least), so half of the
	// default leaves room for the fault headers a dead letter adds.
	MaxHeaderBytes = 64 << 10
)

// Rules select what Validate checks.
type Rules struct {
	// Store adds what the outbox and inbox tables need: ids within
	// MaxMessageIDLen, and no NUL byte or invalid UTF-8 in any text
	// (PostgreSQL's text columns refuse both; its json column would turn
	// invalid UTF-8 into U+FFFD).
	Store bool
	// MaxHeaderBytes bounds PropertiesSize; 0 means no bound.
	MaxHeaderBytes int
}

// Edge are the rules Publish, PublishTx, Send and SendTx apply: everything
// every transport and store can carry, so that a message accepted on one
// setup is deliverable on any.
var Edge = Rules{Store: true, MaxHeaderBytes: MaxHeaderBytes}

// InvalidError says which field of a message a transport or store cannot
// carry, and why.
type InvalidError struct {
	Field   string // "correlation id", `header "x-key"`, ...
	Problem string // "is 300 bytes; at most 255 (an AMQP short string)"
}

func (e *InvalidError) Error() string { return e.Field + " " + e.Problem }

// Validate returns an *InvalidError for the first field of m that r says
// cannot be carried, checked in a fixed order, or nil. It never modifies m.
func Validate(m *outbox.Message, r Rules) error {
	if m == nil {
		return &InvalidError{Field: "message", Problem: "is nil"}
	}
	if err := text("message id", m.MessageID, 0, r.Store); err != nil {
		return err
	}
	if r.Store && len(m.MessageID) > MaxMessageIDLen {
		return &InvalidError{Field: "message id", Problem: fmt.Sprintf("is %d bytes; at most %d (the inbox key's bound)", len(m.MessageID), MaxMessageIDLen)}
	}
	for _, f := range []struct{ name, v string }{
		{"correlation id", m.CorrelationID},
		{"message type", m.MessageType},
		{"content type", m.ContentType},
		{"routing key", m.RoutingKey},
	} {
		if err := text(f.name, f.v, MaxShortString, r.Store); err != nil {
			return err
		}
	}
	if kind, name := ParseDestination(m.Destination); m.Destination != "" {
		field := "queue name"
		if kind == "exchange" {
			field = "exchange name"
		}
		if err := text(field, name, MaxShortString, r.Store); err != nil {
			return err
		}
	}
	// The error names the smallest bad key, so that it is the same every
	// time (without sorting on the success path).
	var bad error
	badKey := ""
	for k, v := range m.Headers {
		if bad != nil && k >= badKey {
			continue
		}
		if err := header(k, v, r.Store); err != nil {
			bad, badKey = err, k
		}
	}
	if bad != nil {
		return bad
	}
	if r.MaxHeaderBytes > 0 {
		if n := PropertiesSize(m); n > r.MaxHeaderBytes {
			return &InvalidError{Field: "headers", Problem: fmt.Sprintf("take %d bytes; at most %d (properties and headers travel in one AMQP frame)", n, r.MaxHeaderBytes)}
		}
	}
	return nil
}

// header checks one header: the key is a short string, and a value carried
// as a short-string property must be one too.
func header(k, v string, store bool) error {
	if err := text("header key", k, MaxShortString, store); err != nil {
		return err
	}
	limit := 0
	switch k {
	case HeaderCorrelationID, HeaderContentType, HeaderMessageType:
		limit = MaxShortString
	}
	if err := text("header", v, limit, store); err != nil {
		err.(*InvalidError).Field = fmt.Sprintf("header %q", k)
		return err
	}
	return nil
}

// CheckCorrelationID applies the Edge rules to a correlation id alone (for
// one inherited from a received message).
func CheckCorrelationID(v string) error { return text("correlation id", v, MaxShortString, true) }

// text checks one string: at most max bytes (0: no bound) and, when store
// is set, no NUL byte and valid UTF-8.
func text(field, v string, max int, store bool) error {
	if max > 0 && len(v) > max {
		return &InvalidError{Field: field, Problem: fmt.Sprintf("is %d bytes; at most %d (an AMQP short string)", len(v), max)}
	}
	if !store {
		return nil
	}
	if i := strings.IndexByte(v, 0); i >= 0 {
		return &InvalidError{Field: field, Problem: fmt.Sprintf("contains a NUL byte at offset %d (PostgreSQL text cannot store it)", i)}
	}
	if !utf8.ValidString(v) {
		return &InvalidError{Field: field, Problem: "is not valid UTF-8 (PostgreSQL text cannot store it; encode binary ids as hex or base64)"}
	}
	return nil
}

// PropertiesSize is an upper bound of the bytes m's AMQP properties and
// header table take in a content header frame.
func PropertiesSize(m *outbox.Message) int {
	n := 64 // fixed fields: class, body size, flags, delivery mode, timestamp
	for _, s := range []string{m.MessageID, m.CorrelationID, m.MessageType, m.ContentType} {
		n += 1 + len(s)
	}
	n += 4
	for k, v := range m.Headers {
		n += 1 + len(k) + 1 + 4 + len(v)
	}
	return n
}

// Truncate cuts s to at most n bytes at a UTF-8 boundary, marking the cut.
func Truncate(s string, n int) string {
	const mark = "…(truncated)"
	if len(s) <= n {
		return s
	}
	cut := max(n-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
