package transport

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// StrictJSON is connect's JSON codec ("json" and "json; charset=utf-8")
// without its leniency for unknown fields: connect's own codec discards
// them, so a typo'd field ("priorty") would be silently dropped. This one
// refuses the request with INVALID_ARGUMENT, and protojson's error names
// the field. The binary protobuf codec still skips unknown fields, as
// protobuf's compatibility rules want (a newer client's new field).
func StrictJSON() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(strictJSON{name: "json"}),
		connect.WithCodec(strictJSON{name: "json; charset=utf-8"}),
	}
}

type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) IsBinary() bool { return false }

func (c strictJSON) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("json: %T is not a protobuf message", m)
	}
	return protojson.Marshal(pm)
}

func (c strictJSON) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("json: %T is not a protobuf message", m)
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (c strictJSON) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("json: %T is not a protobuf message", m)
	}
	if len(b) == 0 {
		return errors.New("an empty body is not a JSON object")
	}
	// connect answers an error here with INVALID_ARGUMENT.
	return UnmarshalStrictJSON(b, pm)
}

// UnmarshalStrictJSON decodes a JSON request as StrictJSON does: an
// unknown field is an error that names it.
func UnmarshalStrictJSON(b []byte, m proto.Message) error {
	return protojson.Unmarshal(b, m)
}
