package apierr

import (
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/norn-dev/norn/crdt"
)

// TestDurationIsWhatTheAPITakes: Duration prints a duration as protojson
// does, so an error's numbers can be sent back as they are.
func TestDurationIsWhatTheAPITakes(t *testing.T) {
	for _, d := range []time.Duration{0, time.Hour + time.Second, 250 * time.Millisecond, time.Millisecond,
		1500 * time.Microsecond, 7, -3 * time.Second, -1500 * time.Millisecond, 36 * time.Hour} {
		b, err := protojson.Marshal(durationpb.New(d))
		if err != nil {
			t.Fatal(err)
		}
		if want := string(b[1 : len(b)-1]); Duration(d) != want {
			t.Errorf("Duration(%v) = %q, protojson %q", d, Duration(d), want)
		}
	}
}

// TestFieldErrorsNameTheField: an INVALID_ARGUMENT error of a field, made
// by Invalid or from a crdt.FieldError, names the field in a
// google.rpc.BadRequest detail as well as in its message.
func TestFieldErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		err   error
		field string
	}{
		{Invalid("claimId", "required"), "claimId"},
		{From(crdt.ValidateQueue("task.queue", "")), "task.queue"},
	} {
		var ce *connect.Error
		if !errors.As(tc.err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.HasPrefix(ce.Message(), tc.field+": ") {
			t.Fatalf("%v: want INVALID_ARGUMENT starting %q", tc.err, tc.field)
		}
		var got []string
		for _, d := range ce.Details() {
			v, err := d.Value()
			if br, ok := v.(*errdetails.BadRequest); err == nil && ok {
				for _, fv := range br.GetFieldViolations() {
					got = append(got, fv.GetField()+" | "+fv.GetDescription())
				}
			}
		}
		if len(got) != 1 || !strings.HasPrefix(got[0], tc.field+" | ") || strings.HasSuffix(got[0], "| ") {
			t.Fatalf("%v: field violations %q, want one of %s with its reason", tc.err, got, tc.field)
		}
	}
}
