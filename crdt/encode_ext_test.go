package crdt

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestEncodeFormatUnchanged pins the encoding of tasks that use neither a
// retry policy nor failures: the bytes were computed by the code before
// those fields existed, and every version must keep reading and writing
// them as they are (a task's digest is its identity in anti-entropy, and
// older nodes must decode what newer ones write).
func TestEncodeFormatUnchanged(t *testing.T) {
	tests := []struct {
		name string
		task *Task
		hex  string
	}{
		{
			name: "spec, update, terminal",
			task: &Task{
				ID: 300,
				Spec: &Spec{Queue: "emails", Priority: -2, Payload: []byte("hi"), NotBeforeMs: 1_700_000_000_000,
					DependsOn: []uint64{5, 200}, MaxClaims: 3, CreatedAt: Timestamp{WallMs: 1_700_000_000_001, Logical: 2, Node: 7}},
				Updates: []Update{{Claim: 9, Seq: 1, At: Timestamp{WallMs: 1_700_000_000_002, Node: 7}, Progress: 0.5,
					Message: "half", Data: []byte{1, 2}}},
				Terminals: []Terminal{{At: Timestamp{WallMs: 1_700_000_000_003, Logical: 1, Node: 8}, Kind: Aborted, Claim: 9,
					Errors: []TaskError{{Code: "E1", Description: "boom", Args: []string{"x", "attempt=1"}}}, Result: []byte("r")}},
			},
			hex: "01ac020106656d61696c730302686980a0abfef9620205c8010382a0abfef962020701090184a0abfef96200073fe0" +
				"0000000000000468616c660201020186a0abfef962010802090102453104626f6f6d02017809617474656d70743d310172",
		},
		{
			name: "cancel without spec",
			task: &Task{ID: 1, Terminals: []Terminal{{At: Timestamp{WallMs: 5, Node: 1}, Kind: Cancelled}}},
			hex:  "01010000010a000103000000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := hex.DecodeString(tt.hex)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.task.Encode(); !bytes.Equal(got, want) {
				t.Fatalf("encoding changed:\ngot  %x\nwant %x", got, want)
			}
			x, err := Decode(want)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(x, tt.task) {
				t.Fatalf("decode:\ngot  %+v\nwant %+v", x, tt.task)
			}
		})
	}
}

// extTasks are canonical tasks that use the retry policy, failures and
// dead terminal events.
func extTasks() []*Task {
	ts := func(ms int64) Timestamp { return Timestamp{WallMs: 1_700_000_000_000 + ms, Logical: 1, Node: 2} }
	policy := &RetryPolicy{MaxAttempts: 5, InitialMs: 1000, MaxMs: 60_000, MultiplierMilli: 2000, JitterMilli: 100}
	extreme := &RetryPolicy{MaxAttempts: math.MaxUint32, InitialMs: MaxBackoffMs, MaxMs: MaxBackoffMs,
		MultiplierMilli: MaxMultiplierMilli, JitterMilli: 1000}
	return []*Task{
		{ID: 1, Spec: &Spec{Queue: "q", Retry: &RetryPolicy{MultiplierMilli: 1000}}},
		{ID: 2, Spec: &Spec{Queue: "q", Payload: []byte("p"), MaxClaims: math.MaxUint32, Retry: extreme, CreatedAt: ts(0)}},
		{ID: 3, Failures: []Failure{{Claim: 7, At: ts(1), Expired: true}}},
		{
			ID:      4,
			Spec:    &Spec{Queue: "emails", MaxClaims: 5, Retry: policy, CreatedAt: ts(0)},
			Updates: []Update{{Claim: 7, Seq: 1, At: ts(2), Progress: 0.25}},
			Terminals: []Terminal{
				{At: ts(9), Kind: Dead, Claim: 12, Errors: []TaskError{{Code: "E", Args: []string{"attempt=3"}}}},
				{At: ts(10), Kind: Cancelled},
			},
			Failures: []Failure{
				{Claim: 7, At: ts(3), Errors: []TaskError{{Code: "E", Description: "boom", Args: []string{"attempt=1"}}}},
				{Claim: 9, At: ts(5), Expired: true},
				{Claim: 1 << 40, At: ts(8), Errors: []TaskError{{Code: "E"}, {Code: "F"}}},
			},
		},
		{ID: 5, Terminals: []Terminal{{At: ts(4), Kind: Dead}}},
		{ID: 6, Spec: &Spec{Queue: "q", NotBeforeMs: 5, DeadlineMs: 1_700_000_060_000, CreatedAt: ts(0)}},
		{ID: 7, Spec: &Spec{Queue: "q", Retry: policy, DeadlineMs: math.MaxInt64}, Failures: []Failure{{Claim: 3, At: ts(1)}}},
		{ID: 8, Spec: &Spec{Queue: "q", UniqueKey: "report:42", CreatedAt: ts(0)}},
		{ID: 9, Spec: &Spec{Queue: "q", DeadlineMs: 9, UniqueKey: "ключ", UniqueForMs: 3_600_000, Retry: policy}},
		{ID: 10, Spec: &Spec{Queue: "q", FairnessKey: "tenant-7", FairnessWeight: 1, CreatedAt: ts(0)}},
		{ID: 11, Spec: &Spec{Queue: "q", UniqueKey: "u", FairnessKey: "租户", FairnessWeight: MaxFairnessWeight, Retry: policy}},
	}
}

func TestEncodeExtRoundTrip(t *testing.T) {
	for _, x := range extTasks() {
		enc := x.Encode()
		var want byte
		if x.Spec != nil {
			want |= flagSpec
			if x.Spec.Retry != nil {
				want |= flagRetry
			}
			if x.Spec.DeadlineMs != 0 {
				want |= flagDeadline
			}
			if x.Spec.UniqueKey != "" {
				want |= flagUnique
			}
			if x.Spec.FairnessKey != "" {
				want |= flagFairness
			}
		}
		if len(x.Failures) > 0 {
			want |= flagFailures
		}
		if flags := enc[1+uvarintLen(x.ID)]; flags != want {
			t.Errorf("task %d: flags %#x, want %#x", x.ID, flags, want)
		}
		y, err := Decode(enc)
		if err != nil {
			t.Fatalf("task %d: %v", x.ID, err)
		}
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("decode(encode(x)) != x:\nx=%+v\ny=%+v", x, y)
		}
		if !bytes.Equal(y.Encode(), enc) {
			t.Fatalf("task %d: re-encoding differs", x.ID)
		}
		if err := x.Validate(DefaultLimits); err != nil {
			t.Errorf("task %d: %v", x.ID, err)
		}
	}
}

func TestDecodeRejectsNonCanonicalExt(t *testing.T) {
	spec := &Spec{Queue: "q"}
	good := (&Task{ID: 1, Spec: &Spec{Queue: "q", Retry: &RetryPolicy{MultiplierMilli: 1000}},
		Failures: []Failure{{Claim: 1}, {Claim: 2, Expired: true}}}).Encode()
	withPolicy := func(p RetryPolicy) []byte { return (&Task{ID: 1, Spec: &Spec{Queue: "q", Retry: &p}}).Encode() }
	// flags 0x03 on a spec that has no policy: the policy would be read
	// from the counts that follow, and runs out.
	noPolicy := (&Task{ID: 1, Spec: spec}).Encode()
	noPolicy[2] = flagSpec | flagRetry
	// The deadline bit on a spec without a deadline (0) or with a
	// negative one.
	deadline := func(ms int64) []byte {
		b := (&Task{ID: 1, Spec: &Spec{Queue: "q"}}).Encode()
		b[2] |= flagDeadline
		return slices.Insert(b, len(b)-2, binary.AppendVarint(nil, ms)...)
	}
	if x, err := Decode(deadline(7)); err != nil || x.Spec.DeadlineMs != 7 {
		t.Fatalf("deadline 7: %+v, %v", x, err)
	}
	tests := []struct {
		name string
		b    []byte
	}{
		{"deadline bit without spec", []byte{1, 1, flagDeadline, 0, 0}},
		{"deadline 0", deadline(0)},
		{"negative deadline", deadline(-5)},
		{"unknown flag bit 5", []byte{1, 1, 0x20, 0, 0}},
		{"unknown flag bit 3", []byte{1, 1, 0x08, 0, 0}},
		{"unknown flag bit 7", []byte{1, 1, 0x80, 0, 0}},
		{"retry bit without spec", []byte{1, 1, flagRetry, 0, 0}},
		{"retry bit without spec, with failures", []byte{1, 1, flagRetry | flagFailures, 0, 0, 1, 1, 0, 0, 0, 0, 0}},
		{"retry bit, no policy bytes", noPolicy},
		{"empty failures section", []byte{1, 1, flagFailures, 0, 0, 0}},
		{"failures bit, no section", []byte{1, 1, flagFailures, 0, 0}},
		{"unsorted failures", (&Task{ID: 1, Failures: []Failure{{Claim: 2}, {Claim: 1}}}).Encode()},
		{"repeated failures", (&Task{ID: 1, Failures: []Failure{{Claim: 1}, {Claim: 1, Expired: true}}}).Encode()},
		{"failure claim 0", (&Task{ID: 1, Failures: []Failure{{Claim: 0}}}).Encode()},
		{"expired byte 2", []byte{1, 1, flagFailures, 0, 0, 1, 1, 0, 0, 0, 2, 0}},
		{"failure non-minimal claim", []byte{1, 1, flagFailures, 0, 0, 1, 0x81, 0, 0, 0, 0, 0, 0}},
		{"failures trailing byte", []byte{1, 1, flagFailures, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0}},
		{"failures truncated", good[:len(good)-1]},
		{"huge failure count", []byte{1, 1, flagFailures, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0}},
		{"multiplier 500", withPolicy(RetryPolicy{MultiplierMilli: 500})},
		{"multiplier too large", withPolicy(RetryPolicy{MultiplierMilli: MaxMultiplierMilli + 1})},
		{"negative initial", withPolicy(RetryPolicy{InitialMs: -1, MultiplierMilli: 1000})},
		{"max below initial", withPolicy(RetryPolicy{InitialMs: 10, MaxMs: 5, MultiplierMilli: 1000})},
		{"max too large", withPolicy(RetryPolicy{MaxMs: MaxBackoffMs + 1, MultiplierMilli: 1000})},
		{"jitter above 1", withPolicy(RetryPolicy{MultiplierMilli: 1000, JitterMilli: 1001})},
		{"bad kind 5", (&Task{ID: 1, Terminals: []Terminal{{Kind: Dead + 1}}}).Encode()},
	}
	if _, err := Decode(good); err != nil {
		t.Fatalf("good encoding: %v", err)
	}
	for _, tt := range tests {
		if _, err := Decode(tt.b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", tt.name, err)
		}
		if _, err := DecodeHead(tt.b); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: DecodeHead error %v does not wrap ErrCorrupt", tt.name, err)
		}
	}
	// A policy field that overflows uint32 (maxAttempts 2^32), and the
	// same bytes with maxAttempts 0, which decode.
	policyTask := func(maxAttempts ...byte) []byte {
		b := []byte{1, 1, flagSpec | flagRetry, 1, 'q', 0, 0, 0, 0, 0, 0, 0, 0} // spec {Queue: "q"}
		b = append(b, maxAttempts...)
		return append(b, 0, 0, 0xe8, 0x07, 0, 0, 0) // initial, max, multiplier 1000, jitter; no updates, no terminals
	}
	if _, err := Decode(policyTask(0x80, 0x80, 0x80, 0x80, 0x10)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("maxAttempts 2^32: err = %v, want ErrCorrupt", err)
	}
	if _, err := Decode(policyTask(0x80, 0x00)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("non-minimal maxAttempts: err = %v, want ErrCorrupt", err)
	}
	if x, err := Decode(policyTask(0)); err != nil || x.Spec.Retry == nil || x.Spec.Retry.MultiplierMilli != 1000 {
		t.Errorf("the same encoding with maxAttempts 0: %+v, %v", x, err)
	}
}

func TestUniqueKeyValidate(t *testing.T) {
	for _, c := range []struct {
		key   string
		forMs int64
		field string // "" when valid
	}{
		{"", 0, ""},
		{"k", 0, ""},
		{"k", 1000, ""},
		{strings.Repeat("x", MaxUniqueKeyLen), MaxUniqueForMs, ""},
		{"", 1000, "spec.uniqueFor"},
		{strings.Repeat("x", MaxUniqueKeyLen+1), 0, "spec.uniqueKey"},
		{"a\x00b", 0, "spec.uniqueKey"},
		{"a\nb", 0, "spec.uniqueKey"},
		{"\xff", 0, "spec.uniqueKey"},
		{"k", -1, "spec.uniqueFor"},
		{"k", MaxUniqueForMs + 1, "spec.uniqueFor"},
	} {
		err := (&Spec{Queue: "q", UniqueKey: c.key, UniqueForMs: c.forMs}).Validate(DefaultLimits)
		var fe *FieldError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%q for %d: %v", c.key, c.forMs, err)
		case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
			t.Errorf("%q for %d: got %v, want an error naming %s", c.key, c.forMs, err, c.field)
		}
	}
}

func TestFairnessKeyValidate(t *testing.T) {
	for _, c := range []struct {
		key    string
		weight uint32
		field  string // "" when valid
	}{
		{"", 0, ""},
		{"", 1, ""},
		{"t", 0, ""},
		{"t", MaxFairnessWeight, ""},
		{strings.Repeat("x", MaxFairnessKeyLen), 1, ""},
		{"", 2, "spec.fairnessWeight"},
		{"t", MaxFairnessWeight + 1, "spec.fairnessWeight"},
		{strings.Repeat("x", MaxFairnessKeyLen+1), 1, "spec.fairnessKey"},
		{"a\tb", 1, "spec.fairnessKey"},
		{"\xff", 1, "spec.fairnessKey"},
	} {
		err := (&Spec{Queue: "q", FairnessKey: c.key, FairnessWeight: c.weight}).Validate(DefaultLimits)
		var fe *FieldError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%q of weight %d: %v", c.key, c.weight, err)
		case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
			t.Errorf("%q of weight %d: got %v, want an error naming %s", c.key, c.weight, err, c.field)
		}
	}
}

func TestSpecDigestIgnoresCreatedAt(t *testing.T) {
	a := &Spec{Queue: "q", Payload: []byte("p"), UniqueKey: "k", CreatedAt: Timestamp{WallMs: 1}}
	b := *a
	b.CreatedAt = Timestamp{WallMs: 2, Logical: 3}
	if SpecDigest(a) != SpecDigest(&b) {
		t.Fatal("specs that differ only in CreatedAt have different digests")
	}
	b.Payload = []byte("q")
	if SpecDigest(a) == SpecDigest(&b) {
		t.Fatal("specs with different payloads have one digest")
	}
	c := *a
	c.UniqueForMs = 1000
	if SpecDigest(a) == SpecDigest(&c) {
		t.Fatal("specs with different windows have one digest")
	}
}
