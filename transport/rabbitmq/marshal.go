package rabbitmq

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/barewire-go/barewire/internal/wire"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// propertyHeaders are the headers carried by AMQP properties instead of the
// header table.
var propertyHeaders = map[string]bool{
	wire.HeaderMessageID:     true,
	wire.HeaderCorrelationID: true,
	wire.HeaderContentType:   true,
	wire.HeaderMessageType:   true,
}

// toPublishing maps an outbox message onto AMQP properties and headers:
// message_id, correlation_id, content_type and type come from the message's
// fields (or, when a field is empty, from the matching header); every other
// header becomes a string entry of the header table. Messages are persistent.
// maxShortString is the AMQP 0-9-1 limit of a short string property.
const maxShortString = 255

func toPublishing(m *outbox.Message, now time.Time) amqp.Publishing {
	pick := func(field, header string) string {
		if field != "" {
			return field
		}
		return m.Headers[header]
	}
	var headers amqp.Table
	for k, v := range m.Headers {
		if propertyHeaders[k] {
			continue
		}
		if headers == nil {
			headers = make(amqp.Table, len(m.Headers))
		}
		headers[k] = v
	}
	headers = withSlot(headers, m.Headers[wire.HeaderOrderingKey])
	ts := m.CreatedAt
	if ts.IsZero() {
		ts = now
	}
	id := pick(m.MessageID, wire.HeaderMessageID)
	if len(id) > maxShortString {
		// AMQP short strings hold 255 bytes; a longer id (from a foreign
		// publisher's header) would make the client close the connection.
		// Carry it in the header the receiving side also reads.
		if headers == nil {
			headers = amqp.Table{}
		}
		headers[wire.HeaderWatermillUUID] = id
		id = ""
	}
	return amqp.Publishing{
		Headers:       headers,
		ContentType:   pick(m.ContentType, wire.HeaderContentType),
		DeliveryMode:  amqp.Persistent,
		CorrelationId: pick(m.CorrelationID, wire.HeaderCorrelationID),
		MessageId:     id,
		Timestamp:     ts.UTC(),
		Type:          pick(m.MessageType, wire.HeaderMessageType),
		Body:          m.Payload,
	}
}

// PublishingFor returns what Deliver hands the client for m: exchange,
// routing key and message (mandatory aside). The bus's publish fuzz target
// uses it to check that whatever the bus accepts, RabbitMQ can carry.
func PublishingFor(m *outbox.Message) (exchange, key string, pub amqp.Publishing) {
	kind, name := wire.ParseDestination(m.Destination)
	if kind == "exchange" {
		exchange, key = name, m.RoutingKey
	} else {
		key = name
	}
	return exchange, key, toPublishing(m, time.Now())
}

// fromDelivery builds the Watermill message for a delivery. The UUID is the
// message_id property, else a `message-id` header (what BareWire's docs
// tell plain-client publishers to set), else the Watermill header, else ""
// (never invented). The type is the type property, else the BW-MessageType
// header, else Watermill CQRS's `name` metadata, else the exchange the
// message came through (the type, under the exchange-per-type topology).
// Every header is copied into Metadata as a string, whatever its AMQP type.
func fromDelivery(d *amqp.Delivery) *message.Message {
	id := d.MessageId
	for _, h := range []string{wire.HeaderMessageID, wire.HeaderWatermillUUID} {
		if id != "" {
			break
		}
		if v, ok := d.Headers[h]; ok {
			id = headerString(v)
		}
	}
	msg := message.NewMessage(id, d.Body)
	for k, v := range d.Headers {
		msg.Metadata.Set(k, headerString(v))
	}
	if id != "" {
		msg.Metadata.Set(wire.HeaderMessageID, id)
	}
	if d.CorrelationId != "" {
		msg.Metadata.Set(wire.HeaderCorrelationID, d.CorrelationId)
	}
	if d.Type != "" {
		msg.Metadata.Set(wire.HeaderMessageType, d.Type)
	} else if msg.Metadata.Get(wire.HeaderMessageType) == "" {
		// A Watermill-native publisher (watermill-amqp's default
		// marshaler) sets no type property: take the type from the name
		// Watermill's CQRS marshalers put in the metadata, else from the
		// exchange the message came through, which under the bus's
		// exchange-per-type topology is the message type.
		if v := msg.Metadata.Get(wire.HeaderWatermillName); v != "" {
			msg.Metadata.Set(wire.HeaderMessageType, v)
		} else if d.Exchange != "" {
			msg.Metadata.Set(wire.HeaderMessageType, d.Exchange)
		}
	}
	if d.ContentType != "" {
		msg.Metadata.Set(wire.HeaderContentType, d.ContentType)
	}
	// Where the message was sent, for the fault headers of a dead letter.
	if d.Exchange != "" {
		msg.Metadata.Set(wire.HeaderDestination, wire.ExchangePrefix+d.Exchange)
	} else if d.RoutingKey != "" {
		msg.Metadata.Set(wire.HeaderDestination, wire.QueuePrefix+d.RoutingKey)
	}
	msg.Metadata.Set(transport.MetaRedelivered, strconv.FormatBool(d.Redelivered))
	if v, ok := d.Headers["x-delivery-count"]; ok {
		msg.Metadata.Set(transport.MetaDeliveryCount, headerString(v))
	}
	return msg
}

// headerString renders any AMQP field value as a readable string: scalars in
// their natural form, timestamps as RFC 3339, tables and arrays (x-death) as
// JSON. It never fails.
func headerString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
		return base64.StdEncoding.EncodeToString(x)
	case bool:
		return strconv.FormatBool(x)
	case int8:
		return strconv.FormatInt(int64(x), 10)
	case int16:
		return strconv.FormatInt(int64(x), 10)
	case int32:
		return strconv.FormatInt(int64(x), 10)
	case int64:
		return strconv.FormatInt(x, 10)
	case int:
		return strconv.Itoa(x)
	case uint8:
		return strconv.FormatUint(uint64(x), 10)
	case uint16:
		return strconv.FormatUint(uint64(x), 10)
	case uint32:
		return strconv.FormatUint(uint64(x), 10)
	case uint64:
		return strconv.FormatUint(x, 10)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case amqp.Decimal:
		return decimalString(x)
	case amqp.Table, []any, map[string]any:
		b, err := json.Marshal(jsonable(x))
		if err != nil {
			return fmt.Sprint(x)
		}
		return string(b)
	default:
		return fmt.Sprint(x)
	}
}

// jsonable converts AMQP values into values encoding/json renders well.
func jsonable(v any) any {
	switch x := v.(type) {
	case amqp.Table:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case float32:
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return headerString(x)
		}
		return x
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return headerString(x)
		}
		return x
	case []byte, time.Time, amqp.Decimal:
		return headerString(x)
	default:
		return x
	}
}

func decimalString(d amqp.Decimal) string {
	s := strconv.FormatInt(int64(d.Value), 10)
	if d.Scale == 0 {
		return s
	}
	neg := false
	if s[0] == '-' {
		neg, s = true, s[1:]
	}
	for len(s) <= int(d.Scale) {
		s = "0" + s
	}
	s = s[:len(s)-int(d.Scale)] + "." + s[len(s)-int(d.Scale):]
	if neg {
		s = "-" + s
	}
	return s
}

// amqpArgs converts user-supplied declaration arguments into a table the
// AMQP client accepts: nested maps become tables, string slices arrays,
// durations milliseconds and unsigned integers int64.
func amqpArgs(in map[string]any) amqp.Table {
	if len(in) == 0 {
		return nil
	}
	out := make(amqp.Table, len(in))
	for k, v := range in {
		out[k] = amqpValue(v)
	}
	return out
}

func amqpValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		return amqpArgs(x)
	case amqp.Table:
		return amqpArgs(x)
	case map[string]string:
		t := make(amqp.Table, len(x))
		for k, e := range x {
			t[k] = e
		}
		return t
	case []string:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = amqpValue(e)
		}
		return out
	case time.Duration:
		return x.Milliseconds()
	case uint:
		return int64(x)
	case uint64:
		return int64(x)
	case int:
		return int64(x)
	default:
		return v
	}
}

// MessageFromDelivery returns the Watermill message this transport hands
// the bus for d: id, type, content type and correlation id from the AMQP
// properties (with the fallbacks of a foreign publisher: a `message-id` or
// `_watermill_message_uuid` header, CQRS's `name`, the exchange), every
// header as a string whatever its AMQP type, and the redelivered flag and
// delivery count. Package transport/wmpubsub/wmamqp reads deliveries with
// it, so that both speak one wire format.
func MessageFromDelivery(d *amqp.Delivery) *message.Message { return fromDelivery(d) }
