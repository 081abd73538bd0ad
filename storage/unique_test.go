package storage

import (
	"errors"
	"slices"
	"testing"
)

// Unique key records are written and deleted with the FSM's batch, kept
// apart per partition, listed in order from a point, counted in the
// FSM's digest, and replaced wholesale by a restore.
func TestClaimFSMUniques(t *testing.T) {
	s, _ := memStore(t)
	_, empty, err := s.ClaimFSMDigest(0)
	if err != nil {
		t.Fatal(err)
	}
	put := func(p uint16, idx uint64, us ...FSMUnique) {
		t.Helper()
		if err := s.ApplyClaimFSM(p, ClaimFSMUpdate{AppliedIndex: idx, Uniques: us}, false); err != nil {
			t.Fatal(err)
		}
	}
	put(0, 1, FSMUnique{Queue: "q", Key: "b", Value: []byte("B")}, FSMUnique{Queue: "q", Key: "a", Value: []byte("A")},
		FSMUnique{Queue: "q.x", Key: "a", Value: []byte("QX")}, FSMUnique{Queue: "q", Key: "a b", Value: []byte("AB")})
	put(1, 1, FSMUnique{Queue: "q", Key: "a", Value: []byte("other partition")})
	if v, err := s.ClaimFSMUnique(0, "q", "a"); err != nil || string(v) != "A" {
		t.Fatalf("q/a = %q, %v", v, err)
	}
	if _, err := s.ClaimFSMUnique(0, "q", "c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("q/c: %v", err)
	}
	list := func(q, k string, limit int) []string {
		var got []string
		if err := s.ScanUniques(0, q, k, limit, func(q, k string, v []byte) bool {
			got = append(got, q+"/"+k+"="+string(v))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := []string{"q/a=A", "q/a b=AB", "q/b=B", "q.x/a=QX"}
	if got := list("", "", 10); !slices.Equal(got, want) {
		t.Fatalf("all: %q, want %q", got, want)
	}
	if got := list("q", "a", 2); !slices.Equal(got, want[1:3]) {
		t.Fatalf("after q/a, 2: %q, want %q", got, want[1:3])
	}
	_, d1, _ := s.ClaimFSMDigest(0)
	if d1 == empty {
		t.Fatal("the digest does not count unique records")
	}
	put(0, 2, FSMUnique{Queue: "q", Key: "b"}) // deleted
	if _, err := s.ClaimFSMUnique(0, "q", "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("q/b after its delete: %v", err)
	}
	if got := list("", "", 10); !slices.Equal(got, []string{"q/a=A", "q/a b=AB", "q.x/a=QX"}) {
		t.Fatalf("after the delete: %q", got)
	}

	// A snapshot carries them; a restore replaces them.
	snap := s.SnapshotClaimFSM(0)
	var us []FSMUnique
	if err := snap.Uniques(func(q, k string, v []byte) error {
		us = append(us, FSMUnique{Queue: q, Key: k, Value: slices.Clone(v)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	dst, _ := memStore(t)
	if err := dst.ApplyClaimFSM(0, ClaimFSMUpdate{AppliedIndex: 1, Uniques: []FSMUnique{{Queue: "z", Key: "stale", Value: []byte("S")}}}, false); err != nil {
		t.Fatal(err)
	}
	if err := dst.RestoreClaimFSM(0, 2, nil, nil, nil, us); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.ClaimFSMUnique(0, "z", "stale"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a record the snapshot lacks survived the restore: %v", err)
	}
	_, sd, _ := s.ClaimFSMDigest(0)
	_, dd, _ := dst.ClaimFSMDigest(0)
	if sd != dd {
		t.Fatalf("digests after restore differ: %x vs %x", sd, dd)
	}
}
