package endpoint

import (
	"encoding/json"
	"fmt"
)

// Serializer turns messages into bodies and back. JSON is the default; set
// Endpoint.Serializer to change how an endpoint reads bodies, and
// bus.WithSerializer to change how the bus writes them.
type Serializer interface {
	// ContentType is the media type written to the content-type header.
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default serializer (application/json, encoding/json).
var JSON Serializer = jsonSerializer{}

type jsonSerializer struct{}

func (jsonSerializer) ContentType() string { return "application/json" }

func (jsonSerializer) Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("endpoint: marshal %T as JSON: %w", v, err)
	}
	return b, nil
}

func (jsonSerializer) Unmarshal(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("endpoint: malformed JSON body for %T: %w", v, err)
	}
	return nil
}
