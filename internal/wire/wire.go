package wire

import (
	"strings"

	"github.com/google/uuid"
)

// Header names. They match BareWire (.NET) so that services written with
// either framework can share a broker.
const (
	// HeaderMessageID carries a caller-chosen message id that is preserved
	// end to end (outbox row, AMQP message_id property, inbox key).
	HeaderMessageID = "message-id"
	// HeaderCorrelationID carries the correlation id (AMQP correlation_id).
	HeaderCorrelationID = "correlation-id"
	// HeaderMessageType names the message type used for dispatch (AMQP type).
	HeaderMessageType = "BW-MessageType"
	// HeaderExchange overrides the exchange a published message is sent to.
	HeaderExchange = "BW-Exchange"
	// HeaderContentType is the body's media type (AMQP content_type).
	HeaderContentType = "content-type"
	// HeaderRoutingKey overrides the routing key of a published message.
	HeaderRoutingKey = "BW-RoutingKey"
	// HeaderDestination records where a message was sent ("exchange:x" or "queue:y").
	HeaderDestination = "BW-Destination"

	// Fault headers, set on messages moved to an error queue.
	HeaderFaultReason     = "BW-Fault-Reason"
	HeaderFaultType       = "BW-Fault-Type"
	HeaderFaultStack      = "BW-Fault-Stack"
	HeaderFaultEndpoint   = "BW-Fault-Endpoint"
	HeaderFaultAttempts   = "BW-Fault-Attempts"
	HeaderFaultTime       = "BW-Fault-Time"
	HeaderFaultExchange   = "BW-Fault-Exchange"
	HeaderFaultRoutingKey = "BW-Fault-RoutingKey"
	// HeaderFaultMessageID holds, quoted, the original id of a message
	// dead-lettered because its id could not be stored (NUL, invalid UTF-8,
	// too long); the dead letter carries a stand-in id derived from it.
	HeaderFaultMessageID = "BW-Fault-MessageID"
	// HeaderFaultUnroutable is set on a dead letter that went to the error
	// queue because the endpoint's dead-letter exchange routed it nowhere.
	HeaderFaultUnroutable = "BW-Fault-Unroutable"
	// HeaderFaultHeadersDropped is set on a dead letter sent without the
	// received message's headers because the transport refused it with
	// them; it says how many were dropped and the transport's error.
	HeaderFaultHeadersDropped = "BW-Fault-HeadersDropped"

	// HeaderRedeliveryCount counts second-level (delayed) redeliveries.
	HeaderRedeliveryCount = "BW-Redelivery-Count"

	// HeaderResponseAddress is where the response to a request goes
	// ("queue:<the requesting instance's reply queue>").
	HeaderResponseAddress = "BW-ResponseAddress"
	// HeaderRequestID is set on a response: the message id of the request
	// it answers.
	HeaderRequestID = "BW-RequestId"

	// HeaderWatermillUUID is where Watermill-native publishers put the id.
	HeaderWatermillUUID = "_watermill_message_uuid"
	// HeaderWatermillName is the metadata in which Watermill's CQRS
	// marshalers (cqrs.JSONMarshaler, ProtobufMarshaler) name the message
	// type; read as the type when a message carries none of its own.
	HeaderWatermillName = "name"
)

// Destination prefixes.
const (
	ExchangePrefix = "exchange:"
	QueuePrefix    = "queue:"
)

// NewID returns a fresh message id (a random UUID as a string).
func NewID() string { return uuid.NewString() }

// responseNamespace makes response ids: a UUID of its own so that they
// never equal an id made another way.
var responseNamespace = uuid.MustParse("6c1b7f0e-9b4a-5a57-8e0e-3c5f1d2a9b10")

// ResponseID returns the message id of the response endpoint gives to
// request requestID: the same every time, so that a response written again
// (a request redelivered after its consumer's transaction committed) is one
// message to the receiving side.
func ResponseID(requestID, endpoint string) string {
	return uuid.NewSHA1(responseNamespace, []byte(endpoint+"\x00"+requestID)).String()
}

// ParseDestination splits "queue:name" or "exchange:name". A bare name is a queue.
func ParseDestination(d string) (kind, name string) {
	switch {
	case strings.HasPrefix(d, QueuePrefix):
		return "queue", strings.TrimPrefix(d, QueuePrefix)
	case strings.HasPrefix(d, ExchangePrefix):
		return "exchange", strings.TrimPrefix(d, ExchangePrefix)
	default:
		return "queue", d
	}
}

// ErrorQueue is the name of the queue that receives an endpoint's dead letters
// when no dead-letter exchange is configured.
func ErrorQueue(endpoint string) string { return endpoint + "_error" }
