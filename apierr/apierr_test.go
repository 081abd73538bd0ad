package apierr

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
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
