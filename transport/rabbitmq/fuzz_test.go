package rabbitmq

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/transport"
)

// fuzzValue builds an AMQP field value of every type the client decodes
// (what a foreign publisher or the broker itself can put in a header) from
// kind and raw, nesting tables and arrays depth levels deep.
func fuzzValue(kind uint8, raw []byte, depth int) any {
	u64 := func() uint64 {
		var b [8]byte
		copy(b[:], raw)
		return binary.LittleEndian.Uint64(b[:])
	}
	switch kind % 17 {
	case 0:
		return string(raw)
	case 1:
		return raw // byte array ('x'), may be invalid UTF-8
	case 2:
		return len(raw)%2 == 0
	case 3:
		return int8(u64())
	case 4:
		return int16(u64())
	case 5:
		return int32(u64())
	case 6:
		return int64(u64())
	case 7:
		return uint8(u64())
	case 8:
		return uint16(u64())
	case 9:
		return uint32(u64())
	case 10:
		return math.Float32frombits(uint32(u64())) // NaN and ±Inf included
	case 11:
		return math.Float64frombits(u64())
	case 12:
		return time.Unix(int64(u64()>>1)%(1<<40), 0)
	case 13:
		return amqp.Decimal{Scale: uint8(u64()), Value: int32(u64() >> 8)}
	case 14:
		return nil
	case 15, 16:
		if depth <= 0 {
			return string(raw)
		}
		half := len(raw) / 2
		inner := fuzzValue(raw0(raw), raw[half:], depth-1)
		if kind%17 == 15 {
			return amqp.Table{string(raw[:half]): inner, "count": int64(len(raw))}
		}
		return []any{inner, amqp.Table{"reason": "expired", "queue": string(raw[:half])}}
	}
	return nil
}

func raw0(b []byte) uint8 {
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// FuzzFromDelivery: whatever properties, headers (any AMQP type, nested
// tables and arrays, decimals, byte arrays, x-death) and body a delivery
// carries, fromDelivery never panics and builds a message whose id follows
// the documented precedence, whose headers are all present as strings
// (tables and arrays as valid JSON) and whose body is the delivery's.
func FuzzFromDelivery(f *testing.F) {
	long := strings.Repeat("x", 300)
	f.Add("m-1", "c-1", "OrderPlaced", "application/json", "OrderPlaced", "", false, []byte(`{"a":1}`), "tenant", uint8(0), []byte("acme"), uint8(0))
	f.Add("", "", "", "", "", "orders", true, []byte{}, "message-id", uint8(0), []byte("from-header"), uint8(0))
	f.Add("", "", "", "", "", "", false, []byte(nil), "_watermill_message_uuid", uint8(1), []byte{0xff, 0xfe, 0x00}, uint8(0))
	f.Add("a\x00b", "\xff\xfe", long, "\x00", "", "q", true, []byte{0, 1, 2}, "x-death", uint8(16), []byte("orders_error-and-more-bytes"), uint8(3))
	f.Add(strings.Repeat("i", 255), "", "T", "", "", "", false, []byte("not json"), "x-delivery-count", uint8(6), []byte{5, 0, 0, 0, 0, 0, 0, 0}, uint8(0))
	f.Add("id", "", "T", "", "", "", false, []byte("{}"), "nested", uint8(15), []byte("key-and-value-bytes"), uint8(4))
	f.Add("id", "", "T", "", "", "", false, []byte("{}"), "dec", uint8(13), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, uint8(0))
	f.Add("id", "", "T", "", "", "", false, []byte("{}"), "nan", uint8(11), []byte{1, 0, 0, 0, 0, 0, 0xf8, 0x7f}, uint8(0))
	f.Add("id", "", "T", "", "", "", false, []byte("{}"), "inf32", uint8(10), []byte{0, 0, 0x80, 0x7f}, uint8(0))
	f.Add("id", "", "T", "", "", "", false, []byte("{}"), "message-id", uint8(6), []byte{42}, uint8(0))
	f.Add("", "", "", "", "", "", false, []byte("{}"), "message-id", uint8(15), []byte("table-as-id"), uint8(2))
	f.Fuzz(func(t *testing.T, id, corr, typ, ct, exchange, key string, redelivered bool, body []byte,
		hk string, kind uint8, raw []byte, depth uint8) {
		headers := amqp.Table{hk: fuzzValue(kind, raw, int(depth%5))}
		d := &amqp.Delivery{
			MessageId: id, CorrelationId: corr, Type: typ, ContentType: ct,
			Exchange: exchange, RoutingKey: key, Redelivered: redelivered, Body: body, Headers: headers,
		}
		msg := fromDelivery(d)
		if msg == nil {
			t.Fatal("nil message")
		}
		wantID := id
		for _, h := range []string{wire.HeaderMessageID, wire.HeaderWatermillUUID} {
			if v, ok := headers[h]; ok && wantID == "" {
				wantID = headerString(v)
			}
		}
		if msg.UUID != wantID {
			t.Fatalf("id %q, want %q", msg.UUID, wantID)
		}
		if wantID != "" && msg.Metadata.Get(wire.HeaderMessageID) != wantID {
			t.Fatalf("message-id metadata %q, want %q", msg.Metadata.Get(wire.HeaderMessageID), wantID)
		}
		if string(msg.Payload) != string(body) {
			t.Fatal("body changed")
		}
		if got := msg.Metadata.Get(transport.MetaRedelivered); got != strconv.FormatBool(redelivered) {
			t.Fatalf("%s = %q", transport.MetaRedelivered, got)
		}
		for prop, h := range map[string]string{corr: wire.HeaderCorrelationID, typ: wire.HeaderMessageType, ct: wire.HeaderContentType} {
			if prop != "" && msg.Metadata.Get(h) != prop {
				t.Fatalf("%s = %q, want the property %q", h, msg.Metadata.Get(h), prop)
			}
		}
		if _, ok := msg.Metadata[hk]; !ok {
			t.Fatalf("header %q missing from the metadata", hk)
		}
		switch headers[hk].(type) {
		case amqp.Table, []any:
			if v := msg.Metadata[hk]; !propertyHeaders[hk] && hk != wire.HeaderDestination && hk != transport.MetaRedelivered && !json.Valid([]byte(v)) {
				t.Fatalf("table/array header rendered as invalid JSON: %q", v)
			}
		}
	})
}
