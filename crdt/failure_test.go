package crdt

import (
	"bytes"
	"reflect"
	"testing"
)

// Two failures of one claim with different contents (which a correct
// cluster never writes) resolve to the smaller encoding, whatever the
// order of the joins.
func TestFailureKeyCollisionDeterministic(t *testing.T) {
	f1 := Failure{Claim: 3, At: Timestamp{WallMs: 10}, Errors: []TaskError{{Code: "A"}}}
	f2 := Failure{Claim: 3, At: Timestamp{WallMs: 10}, Expired: true}
	x, _ := mustJoin(t, &Task{ID: 1, Failures: []Failure{f1}}, &Task{ID: 1, Failures: []Failure{f2}})
	y, _ := mustJoin(t, &Task{ID: 1, Failures: []Failure{f2}}, &Task{ID: 1, Failures: []Failure{f1}})
	if len(x.Failures) != 1 || !reflect.DeepEqual(x, y) {
		t.Fatalf("collision not resolved deterministically: %+v vs %+v", x, y)
	}
	want := f1
	if bytes.Compare(appendFailure(nil, &f2), appendFailure(nil, &f1)) < 0 {
		want = f2
	}
	if !reflect.DeepEqual(x.Failures[0], want) {
		t.Errorf("kept %+v, want the smaller encoding %+v", x.Failures[0], want)
	}
}

// Join takes the union of the failures, sorted by claim, and leaves its
// inputs as they were: the result does not share their backing arrays.
func TestJoinFailuresUnion(t *testing.T) {
	a := &Task{ID: 1, Failures: []Failure{{Claim: 1}, {Claim: 5, Expired: true}}}
	b := &Task{ID: 1, Failures: []Failure{{Claim: 3, Errors: []TaskError{{Code: "E"}}}, {Claim: 5, Expired: true}}}
	aBefore, bBefore := a.Encode(), b.Encode()
	j, conflict := mustJoin(t, a, b)
	if conflict {
		t.Error("conflict reported without specs")
	}
	var claims []uint64
	for _, f := range j.Failures {
		claims = append(claims, f.Claim)
	}
	if !reflect.DeepEqual(claims, []uint64{1, 3, 5}) {
		t.Fatalf("joined failures %v, want claims 1, 3, 5", claims)
	}
	j.Failures[0].Claim = 99
	if !bytes.Equal(a.Encode(), aBefore) || !bytes.Equal(b.Encode(), bBefore) {
		t.Fatal("Join or a change of its result modified an input")
	}
}

func TestNormalizeFailures(t *testing.T) {
	x := &Task{ID: 1, Failures: []Failure{{Claim: 4}, {Claim: 2, Expired: true}, {Claim: 4}, {Claim: 2}}}
	x.Normalize()
	want := []Failure{{Claim: 2}, {Claim: 4}} // of the two claim 2, expired=0 encodes smaller
	if !reflect.DeepEqual(x.Failures, want) {
		t.Fatalf("normalized %+v, want %+v", x.Failures, want)
	}
	empty := &Task{ID: 1, Failures: []Failure{}}
	empty.Normalize()
	if empty.Failures != nil {
		t.Fatalf("empty failures normalize to %#v, want nil", empty.Failures)
	}
}

// Specs that differ only in their retry policy (one has none, or the
// policies differ) conflict, and the lowest digest wins in both orders.
func TestSpecConflictRetryPolicy(t *testing.T) {
	base := Spec{Queue: "a", Payload: []byte("p")}
	withPolicy := func(p RetryPolicy) *Spec { s := base; s.Retry = &p; return &s }
	none := &base
	p1 := withPolicy(RetryPolicy{MaxAttempts: 3, MultiplierMilli: 1000})
	p2 := withPolicy(RetryPolicy{MaxAttempts: 4, MultiplierMilli: 1000})
	p1Copy := withPolicy(RetryPolicy{MaxAttempts: 3, MultiplierMilli: 1000})
	for _, pair := range [][2]*Spec{{none, p1}, {p1, p2}} {
		s1, s2 := pair[0], pair[1]
		want := s1
		if Digest(appendSpec(nil, s2)) < Digest(appendSpec(nil, s1)) {
			want = s2
		}
		for _, order := range [][2]*Spec{{s1, s2}, {s2, s1}} {
			j, conflict := mustJoin(t, &Task{ID: 7, Spec: order[0]}, &Task{ID: 7, Spec: order[1]})
			if !conflict {
				t.Errorf("specs %+v and %+v: conflict not reported", order[0].Retry, order[1].Retry)
			}
			if j.Spec != want {
				t.Errorf("winner %+v, want the lowest digest %+v", j.Spec.Retry, want.Retry)
			}
		}
	}
	// Equal policies in different allocations are the same spec.
	if _, conflict := mustJoin(t, &Task{ID: 7, Spec: p1}, &Task{ID: 7, Spec: p1Copy}); conflict {
		t.Error("equal policies reported as a conflict")
	}
}

func TestTerminalKindString(t *testing.T) {
	for k, want := range map[TerminalKind]string{Completed: "COMPLETED", Aborted: "ABORTED", Cancelled: "CANCELLED",
		Dead: "DEAD", 0: "TerminalKind(0)", Dead + 1: "TerminalKind(5)"} {
		if got := k.String(); got != want {
			t.Errorf("%d: %q, want %q", uint8(k), got, want)
		}
		if valid := k >= 1 && k <= 4; k.valid() != valid {
			t.Errorf("%v.valid() = %v", k, k.valid())
		}
	}
}
