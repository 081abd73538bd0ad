package crdt

import (
	"errors"
	"reflect"
	"testing"
)

// The new fields round-trip, and DecodeHead returns the spec's policy and
// skips the failures.
func TestRetryFieldsRoundTrip(t *testing.T) {
	x := &Task{ID: 7, Spec: &Spec{Queue: "q", Retry: &RetryPolicy{MaxAttempts: 5, InitialMs: 100, MaxMs: 1000, MultiplierMilli: 2000, JitterMilli: 100}},
		Terminals: []Terminal{{At: Timestamp{WallMs: 5}, Kind: Dead, Claim: 9, Errors: []TaskError{{Code: "max_attempts_exceeded", Args: []string{"5"}}}}},
		Failures:  []Failure{{Claim: 3, At: Timestamp{WallMs: 1}, Expired: true}, {Claim: 9, At: Timestamp{WallMs: 4}, Errors: []TaskError{{Code: "boom"}}}}}
	y, err := Decode(x.Encode())
	if err != nil || !reflect.DeepEqual(x, y) {
		t.Fatalf("round trip: %+v, %v", y, err)
	}
	h, err := DecodeHead(x.Encode())
	if err != nil || !reflect.DeepEqual(h.Spec.Retry, x.Spec.Retry) || h.Terminals[0].Kind != Dead {
		t.Fatalf("head: %+v, %v", h, err)
	}
	// Failures alone (a replica that has not seen the enqueue).
	z := &Task{ID: 7, Failures: x.Failures}
	if w, err := Decode(z.Encode()); err != nil || !reflect.DeepEqual(z, w) {
		t.Fatalf("failures without a spec: %+v, %v", w, err)
	}
}

// A DEAD event competes with the others by (At, Kind, Claim): the first
// terminal event wins, whichever kind.
func TestDeadFirstTerminalWins(t *testing.T) {
	dead := Terminal{At: Timestamp{WallMs: 10}, Kind: Dead, Claim: 4}
	done := Terminal{At: Timestamp{WallMs: 11}, Kind: Completed, Claim: 4}
	j, _ := mustJoin(t, &Task{ID: 1, Terminals: []Terminal{done}}, &Task{ID: 1, Terminals: []Terminal{dead}})
	if ev, _ := j.Terminal(); ev.Kind != Dead {
		t.Fatalf("winner %v, want DEAD", ev.Kind)
	}
	tie := Terminal{At: Timestamp{WallMs: 10}, Kind: Cancelled}
	j, _ = mustJoin(t, j, &Task{ID: 1, Terminals: []Terminal{tie}})
	if ev, _ := j.Terminal(); ev.Kind != Cancelled {
		t.Fatalf("tie at the same time: winner %v, want CANCELLED (DEAD sorts after it)", ev.Kind)
	}
}

func TestDecodeRejectsNonCanonicalRetries(t *testing.T) {
	spec := &Spec{Queue: "q", Retry: &RetryPolicy{MaxAttempts: 1, MaxMs: 10, MultiplierMilli: 1000}}
	withRetry := (&Task{ID: 1, Spec: spec}).Encode()
	withFailure := (&Task{ID: 1, Failures: []Failure{{Claim: 2}}}).Encode()
	twoFailures := (&Task{ID: 1, Failures: []Failure{{Claim: 2}, {Claim: 3}}}).Encode()
	bad := *spec.Retry
	bad.MultiplierMilli = 500
	badPolicy := (&Task{ID: 1, Spec: &Spec{Queue: "q", Retry: &bad}}).Encode()
	unsorted := (&Task{ID: 1, Failures: []Failure{{Claim: 3}, {Claim: 2}}}).Encode()
	repeated := (&Task{ID: 1, Failures: []Failure{{Claim: 2}, {Claim: 2}}}).Encode()
	claim0 := (&Task{ID: 1, Failures: []Failure{{Claim: 0}}}).Encode()
	setByte := func(b []byte, i int, v byte) []byte {
		c := append([]byte(nil), b...)
		c[i] = v
		return c
	}
	// Byte offsets: version 0, id 1, flags 2; a failure (no spec, no
	// updates, no terminals) starts at 6 with its count: claim 7, the
	// timestamp 8-10, expired 11.
	tests := []struct {
		name string
		b    []byte
	}{
		{"unknown flag bit", setByte(withFailure, 2, 0x08|flagFailures)},
		{"retry without a spec", setByte(withFailure, 2, flagRetry|flagFailures)},
		{"empty failures section", append(setByte((&Task{ID: 1}).Encode(), 2, flagFailures), 0)},
		{"failures flag without a section", setByte((&Task{ID: 1}).Encode(), 2, flagFailures)},
		{"invalid policy", badPolicy},
		{"failures unsorted", unsorted},
		{"failures repeated", repeated},
		{"failure of claim 0", claim0},
		{"expired byte 2", setByte(withFailure, 11, 2)},
		{"truncated policy", withRetry[:len(withRetry)-3]},
		{"trailing after failures", append(append([]byte(nil), twoFailures...), 0)},
	}
	for _, tc := range tests {
		if _, err := Decode(tc.b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", tc.name, err)
		}
	}
	if _, err := Decode(withRetry); err != nil {
		t.Fatalf("a valid policy: %v", err)
	}
}

func TestValidateRetries(t *testing.T) {
	lim := DefaultLimits
	p := &RetryPolicy{MaxAttempts: 3, InitialMs: 10, MaxMs: 100, MultiplierMilli: 2000}
	cases := []struct {
		spec  Spec
		field string
	}{
		{Spec{Queue: "q", Retry: &RetryPolicy{MaxMs: 10, MultiplierMilli: 900}}, "spec.retry"},
		{Spec{Queue: "q", Retry: p, MaxClaims: 2}, "spec.maxClaims"},
	}
	for _, c := range cases {
		var fe *FieldError
		if err := c.spec.Validate(lim); !errors.As(err, &fe) || fe.Field != c.field || !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want an invalid %s", c.spec, err, c.field)
		}
	}
	if err := (&Spec{Queue: "q", Retry: p, MaxClaims: 3}).Validate(lim); err != nil {
		t.Errorf("max_claims equal to max_attempts: %v", err)
	}
	var fe *FieldError
	if err := (&Task{ID: 1, Failures: []Failure{{Claim: 0}}}).Validate(lim); !errors.As(err, &fe) || fe.Field != "failures[0].claimId" {
		t.Errorf("failure of claim 0: %v", err)
	}
	if err := (&Task{ID: 1, Failures: []Failure{{Claim: 1, Errors: []TaskError{{}}}}}).Validate(lim); !errors.As(err, &fe) || fe.Field != "failures[0].errors[0].code" {
		t.Errorf("failure error without a code: %v", err)
	}
}
