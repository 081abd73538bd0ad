package crdt

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
)

// universe is a pool of events for one task id from which random replica
// states are drawn, so that states overlap, repeat keys with different
// contents, and sometimes carry different specs.
type universe struct {
	id        uint64
	specs     []*Spec
	updates   []Update
	terminals []Terminal
	failures  []Failure
	revivals  []Revival
}

func randBytes(r *rand.Rand, max int) []byte {
	n := r.IntN(max + 1)
	if n == 0 {
		return nil // empty decodes as nil
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

func randTS(r *rand.Rand) Timestamp {
	return Timestamp{WallMs: 1_700_000_000_000 + r.Int64N(5), Logical: r.Uint32N(3), Node: r.Uint32N(3)}
}

func newUniverse(r *rand.Rand) *universe {
	u := &universe{id: r.Uint64()}
	for i := 0; i < 1+r.IntN(2); i++ { // sometimes two conflicting specs
		s := &Spec{
			Queue:       []string{"a", "emails", "q:1"}[r.IntN(3)],
			Priority:    r.Int32N(5) - 2,
			Payload:     randBytes(r, 8),
			NotBeforeMs: r.Int64N(3) * 1000,
			MaxClaims:   r.Uint32N(3),
			CreatedAt:   randTS(r),
		}
		for range r.IntN(3) {
			s.DependsOn = append(s.DependsOn, r.Uint64N(1000)+1)
		}
		if r.IntN(2) == 0 { // a retry policy; two specs may differ only in it
			s.MaxClaims = 0
			s.Retry = &RetryPolicy{MaxAttempts: r.Uint32N(4), InitialMs: r.Int64N(3) * 100, MaxMs: 1000,
				MultiplierMilli: 1000 + r.Uint32N(2)*1000, JitterMilli: r.Uint32N(2) * 200}
		}
		if r.IntN(3) == 0 { // a deadline; two specs may differ only in it
			s.DeadlineMs = s.NotBeforeMs + 1 + r.Int64N(2)*1000
		}
		u.specs = append(u.specs, s)
	}
	for range r.IntN(8) {
		u.updates = append(u.updates, Update{
			Claim:    r.Uint64N(3) + 1,
			Seq:      r.Uint64N(3) + 1, // small ranges: key collisions happen
			At:       randTS(r),
			Progress: float64(r.IntN(5)) / 4,
			Message:  []string{"", "half", "done"}[r.IntN(3)],
			Data:     randBytes(r, 4),
		})
	}
	for range r.IntN(5) {
		t := Terminal{At: randTS(r), Kind: TerminalKind(r.IntN(4) + 1), Claim: r.Uint64N(3)}
		if t.Kind == Aborted || t.Kind == Dead {
			t.Errors = []TaskError{{Code: "E1", Description: "boom", Args: []string{"x"}}}
		}
		t.Result = randBytes(r, 4)
		if r.IntN(3) == 0 {
			t.Life = r.Uint32N(3) // lives 0-2: events of later lives, before or without their revival
		}
		u.terminals = append(u.terminals, t)
	}
	for range r.IntN(3) {
		u.revivals = append(u.revivals, Revival{Life: r.Uint32N(2) + 1, At: randTS(r)}) // lives collide
	}
	for range r.IntN(5) {
		f := Failure{Claim: r.Uint64N(3) + 1, At: randTS(r), Expired: r.IntN(2) == 0} // claims collide
		for range r.IntN(3) {
			e := TaskError{Code: []string{"E1", "timeout"}[r.IntN(2)]}
			if n := r.IntN(3); n > 0 {
				e.Args = []string{"a", "b"}[:n] // empty decodes as nil
			}
			f.Errors = append(f.Errors, e)
		}
		u.failures = append(u.failures, f)
	}
	return u
}

// draw returns a random replica state: a subset of the universe's events.
func (u *universe) draw(r *rand.Rand) *Task {
	t := &Task{ID: u.id}
	if r.IntN(4) != 0 {
		t.Spec = u.specs[r.IntN(len(u.specs))]
	}
	for _, x := range u.updates {
		if r.IntN(2) == 0 {
			t.Updates = append(t.Updates, x)
		}
	}
	for _, x := range u.terminals {
		if r.IntN(2) == 0 {
			t.Terminals = append(t.Terminals, x)
		}
	}
	for _, x := range u.failures {
		if r.IntN(2) == 0 {
			t.Failures = append(t.Failures, x)
		}
	}
	for _, x := range u.revivals {
		if r.IntN(2) == 0 {
			t.Revivals = append(t.Revivals, x)
		}
	}
	t.Normalize()
	return t
}

func mustJoin(t *testing.T, a, b *Task) (*Task, bool) {
	t.Helper()
	j, c, err := Join(a, b)
	if err != nil {
		t.Fatal(err)
	}
	return j, c
}

func seeded(t *testing.T) (*rand.Rand, func()) {
	seed := rand.Uint64()
	return rand.New(rand.NewPCG(seed, 0)), func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	}
}

func iterations() int {
	if testing.Short() {
		return 500
	}
	return 3000
}

func TestJoinLaws(t *testing.T) {
	r, report := seeded(t)
	defer report()
	for i := 0; i < iterations(); i++ {
		u := newUniverse(r)
		a, b, c := u.draw(r), u.draw(r), u.draw(r)
		ea := a.Encode()

		ab, cab := mustJoin(t, a, b)
		ba, cba := mustJoin(t, b, a)
		if !bytes.Equal(ab.Encode(), ba.Encode()) || cab != cba {
			t.Fatalf("not commutative:\na=%+v\nb=%+v\nab=%+v\nba=%+v", a, b, ab, ba)
		}
		if ab.Digest() != ba.Digest() {
			t.Fatalf("digest(a join b) != digest(b join a)")
		}
		abc1, _ := mustJoin(t, ab, c)
		bc, _ := mustJoin(t, b, c)
		abc2, _ := mustJoin(t, a, bc)
		if !bytes.Equal(abc1.Encode(), abc2.Encode()) {
			t.Fatalf("not associative:\n(ab)c=%+v\na(bc)=%+v", abc1, abc2)
		}
		aa, conflict := mustJoin(t, a, a)
		if !bytes.Equal(aa.Encode(), ea) || conflict {
			t.Fatalf("not idempotent: a=%+v a join a=%+v", a, aa)
		}
		// Absorption: the join is an upper bound of both inputs.
		if aba, _ := mustJoin(t, ab, a); !bytes.Equal(aba.Encode(), ab.Encode()) {
			t.Fatalf("join is not an upper bound of a")
		}
		// Join does not modify its inputs.
		if !bytes.Equal(a.Encode(), ea) {
			t.Fatalf("join modified its input")
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	r, report := seeded(t)
	defer report()
	for i := 0; i < iterations(); i++ {
		u := newUniverse(r)
		x := u.draw(r)
		enc := x.Encode()
		y, err := Decode(enc)
		if err != nil {
			t.Fatalf("decode(encode(%+v)): %v", x, err)
		}
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("decode(encode(x)) != x:\nx=%+v\ny=%+v", x, y)
		}
		if !bytes.Equal(y.Encode(), enc) {
			t.Fatalf("re-encoding differs")
		}
	}
}

// headOf is what DecodeHead promises of x: the id, the spec without its
// payload, the first terminal event without errors and result.
func headOf(x *Task) *Task {
	h := &Task{ID: x.ID}
	if x.Spec != nil {
		s := *x.Spec
		s.Payload = nil
		h.Spec = &s
	}
	if ev, ok := x.Terminal(); ok {
		h.Terminals = []Terminal{{At: ev.At, Kind: ev.Kind, Claim: ev.Claim, Life: ev.Life}}
	}
	return h
}

func TestDecodeHead(t *testing.T) {
	r, report := seeded(t)
	defer report()
	for i := 0; i < iterations(); i++ {
		x := newUniverse(r).draw(r)
		enc := x.Encode()
		h, err := DecodeHead(enc)
		if err != nil {
			t.Fatalf("DecodeHead(encode(%+v)): %v", x, err)
		}
		if want := headOf(x); !reflect.DeepEqual(h, want) {
			t.Fatalf("DecodeHead:\ngot  %+v\nwant %+v", h, want)
		}
		// A cut encoding fails, never panics (the terminals past the
		// first are not read, so only cuts before them must fail).
		if cut := r.IntN(len(enc)); cut < len(enc)-1 {
			if _, err := DecodeHead(enc[:cut]); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
		}
	}
}

func TestSpecConflictLowestDigestWins(t *testing.T) {
	s1 := &Spec{Queue: "a", Payload: []byte("one")}
	s2 := &Spec{Queue: "a", Payload: []byte("two")}
	a, b := &Task{ID: 7, Spec: s1}, &Task{ID: 7, Spec: s2}
	want := s1
	if Digest(appendSpec(nil, s2)) < Digest(appendSpec(nil, s1)) {
		want = s2
	}
	for _, pair := range [][2]*Task{{a, b}, {b, a}} {
		j, conflict := mustJoin(t, pair[0], pair[1])
		if !conflict {
			t.Errorf("conflict not reported")
		}
		if j.Spec != want {
			t.Errorf("winner %q, want the lowest digest %q", j.Spec.Payload, want.Payload)
		}
	}
	// A missing spec is not a conflict: the known spec fills in.
	j, conflict := mustJoin(t, &Task{ID: 7}, b)
	if conflict || j.Spec != s2 {
		t.Errorf("join with unknown spec: conflict=%v spec=%v", conflict, j.Spec)
	}
}

func TestFirstTerminalWins(t *testing.T) {
	ts := func(ms int64, node uint32) Timestamp { return Timestamp{WallMs: ms, Node: node} }
	cancel := Terminal{At: ts(100, 1), Kind: Cancelled}
	complete := Terminal{At: ts(101, 2), Kind: Completed, Claim: 5}
	abortSame := Terminal{At: ts(100, 1), Kind: Aborted, Claim: 5}
	completeSame := Terminal{At: ts(100, 1), Kind: Completed, Claim: 9}
	completeSameLowClaim := Terminal{At: ts(100, 1), Kind: Completed, Claim: 4}
	tests := []struct {
		name   string
		events []Terminal
		want   Terminal
	}{
		{"cancel before complete", []Terminal{complete, cancel}, cancel},
		{"same time: kind order", []Terminal{cancel, abortSame, completeSame}, completeSame},
		{"same time and kind: claim order", []Terminal{completeSame, completeSameLowClaim}, completeSameLowClaim},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every arrival order gives the same winner.
			var acc = &Task{ID: 1}
			for i := len(tt.events) - 1; i >= 0; i-- {
				acc, _ = mustJoin(t, acc, &Task{ID: 1, Terminals: []Terminal{tt.events[i]}})
			}
			got, ok := acc.Terminal()
			if !ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("terminal = %+v, want %+v", got, tt.want)
			}
		})
	}
	if _, ok := (&Task{ID: 1}).Terminal(); ok {
		t.Errorf("empty task reports terminal")
	}
}

func TestUpdateKeyCollisionDeterministic(t *testing.T) {
	u1 := Update{Claim: 3, Seq: 1, Progress: 0.5, Message: "a"}
	u2 := Update{Claim: 3, Seq: 1, Progress: 0.5, Message: "b"}
	x, _ := mustJoin(t, &Task{ID: 1, Updates: []Update{u1}}, &Task{ID: 1, Updates: []Update{u2}})
	y, _ := mustJoin(t, &Task{ID: 1, Updates: []Update{u2}}, &Task{ID: 1, Updates: []Update{u1}})
	if len(x.Updates) != 1 || !reflect.DeepEqual(x, y) {
		t.Fatalf("collision not resolved deterministically: %+v vs %+v", x, y)
	}
	last, _ := x.LastUpdate()
	if last.Message != "a" {
		t.Errorf("kept %q, want the smaller encoding %q", last.Message, "a")
	}
}

func TestJoinIDMismatch(t *testing.T) {
	if _, _, err := Join(&Task{ID: 1}, &Task{ID: 2}); !errors.Is(err, ErrIDMismatch) {
		t.Fatalf("err = %v, want ErrIDMismatch", err)
	}
}

func TestDecodeRejectsNonCanonical(t *testing.T) {
	good := (&Task{ID: 1, Spec: &Spec{Queue: "q"},
		Updates: []Update{{Claim: 1, Seq: 1}, {Claim: 1, Seq: 2}}}).Encode()
	unsorted := (&Task{ID: 1, Updates: []Update{{Claim: 1, Seq: 2}, {Claim: 1, Seq: 1}}}).Encode()
	repeated := (&Task{ID: 1, Terminals: []Terminal{{Kind: Cancelled}, {Kind: Cancelled}}}).Encode()
	badProgress := (&Task{ID: 1, Updates: []Update{{Claim: 1, Seq: 1, Progress: 2}}}).Encode()
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"bad version", append([]byte{9}, good[1:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing", append(append([]byte{}, good...), 0)},
		{"non-minimal varint", []byte{1, 0x81, 0x00, 0, 0, 0}},
		{"unknown flags", []byte{1, 1, 2, 0, 0}},
		{"huge count", []byte{1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0}},
		{"unsorted updates", unsorted},
		{"repeated terminals", repeated},
		{"progress out of range", badProgress},
		{"bad kind", (&Task{ID: 1, Terminals: []Terminal{{Kind: 7}}}).Encode()},
	}
	if _, err := Decode(good); err != nil {
		t.Fatalf("good encoding: %v", err)
	}
	for _, tt := range tests {
		if _, err := Decode(tt.b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", tt.name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 32 {
		f.Add(newUniverse(r).draw(r).Encode())
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, herr := DecodeHead(b)
		if herr != nil && !errors.Is(herr, ErrCorrupt) {
			t.Fatalf("DecodeHead error %v does not wrap ErrCorrupt", herr)
		}
		x, err := Decode(b)
		if err == nil && (herr != nil || !reflect.DeepEqual(h, headOf(x))) {
			t.Fatalf("DecodeHead of a canonical encoding: %+v, %v; want %+v", h, herr, headOf(x))
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if enc := x.Encode(); !bytes.Equal(enc, b) {
			t.Fatalf("decoded bytes are not canonical:\nin  %x\nout %x", b, enc)
		}
		if j, _, err := Join(x, x); err != nil || !bytes.Equal(j.Encode(), b) {
			t.Fatalf("join of a decoded state with itself changed it")
		}
	})
}
