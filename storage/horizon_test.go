package storage

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestMergeAboveHorizon checks the reads a merge skips for ids above the
// partition's horizon never hide stored state: a claim recorded before its
// task arrived, and tasks stored before a restart (the horizon is then
// loaded from disk).
func TestMergeAboveHorizon(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	mustMerge(t, s, 0, newTask(1, "q", 0)) // loads the horizon
	// A claim of an id no replica state has reached yet, then its task.
	if err := s.MarkClaimed(0, []ClaimMark{{100, t0 + 50}}); err != nil {
		t.Fatal(err)
	}
	if r := mustMerge(t, s, 0, newTask(100, "q", 0))[0]; r.Existed {
		t.Fatalf("merge after a claim only: %+v, want a new task", r)
	}
	if st, _ := s.GetTask(0, 100); st.Index != IndexClaimed || st.ExpiryMs != t0+50 {
		t.Fatalf("task claimed before it arrived: %+v, want claimed until %d", st, t0+50)
	}
	mustMerge(t, s, 0, newTask(5, "q", 0), newTask(10, "q", 0))
	checkIndexes(t, s, 0)
	if err := s.MarkClaimed(0, []ClaimMark{{200, t0 + 60}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.db = nil

	s, _ = openTestStore(t, fs, "db")
	// The first merge after the restart is of the highest stored id (a
	// meta without state); then of a task stored before the restart.
	mustMerge(t, s, 0, newTask(200, "q", 0))
	if st, _ := s.GetTask(0, 200); st.Index != IndexClaimed || st.ExpiryMs != t0+60 {
		t.Fatalf("after restart, task claimed before it arrived: %+v", st)
	}
	if r := mustMerge(t, s, 0, cancelOf(10, t0+5))[0]; !r.Existed {
		t.Fatalf("cancel of a task stored before the restart: %+v, want joined", r)
	}
	st, _ := s.GetTask(0, 10)
	if _, terminal := st.Task.Terminal(); !terminal || st.Task.Spec == nil || st.Index != IndexNone {
		t.Fatalf("joined task %+v, want its spec and the cancel, in no index", st)
	}
	// Ids above and below the horizon in one batch, highest first.
	res := mustMerge(t, s, 0, newTask(300, "q", 0), newTask(5, "q", 0), newTask(250, "q", 0))
	if res[0].Existed || !res[1].Existed || res[2].Existed {
		t.Fatalf("mixed batch: %+v, want only id 5 existing", res)
	}
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{1, 5, 250, 300}) {
		t.Fatalf("ready = %v, want [1 5 250 300]", got)
	}
	checkIndexes(t, s, 0)
}

// TestClaimFSMRecordAboveHorizon checks claim FSM records stay readable
// whatever the record horizon says: written after it was loaded, below it,
// and after a restart.
func TestClaimFSMRecordAboveHorizon(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	if _, err := s.ClaimFSMRecord(0, 1); !errors.Is(err, ErrNotFound) { // loads the horizon
		t.Fatalf("record of an unclaimed task: %v", err)
	}
	apply := func(index uint64, recs ...FSMRecord) {
		t.Helper()
		if err := s.ApplyClaimFSM(0, ClaimFSMUpdate{AppliedIndex: index, Records: recs}, true); err != nil {
			t.Fatal(err)
		}
	}
	want := func(id uint64, v string) {
		t.Helper()
		got, err := s.ClaimFSMRecord(0, id)
		if v == "" {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("record %d: %q, %v; want none", id, got, err)
			}
			return
		}
		if err != nil || string(got) != v {
			t.Fatalf("record %d: %q, %v; want %q", id, got, err, v)
		}
	}
	apply(1, FSMRecord{ID: 50, Value: []byte("a")})
	want(50, "a")
	apply(2, FSMRecord{ID: 20, Value: []byte("b")}, FSMRecord{ID: 50, Value: nil})
	want(20, "b")
	want(50, "")
	want(60, "")
	s.Close()
	s.db = nil

	s, _ = openTestStore(t, fs, "db")
	want(20, "b")
	apply(3, FSMRecord{ID: 70, Value: []byte("c")})
	want(70, "c")
	// A snapshot restore writes records too.
	if err := s.RestoreClaimFSM(0, 9, []FSMRecord{{ID: 90, Value: []byte("d")}}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	want(90, "d")
	want(20, "")
}

// TestHorizonLanes checks a partition's horizon against the ids stored,
// brute force: after any mix of notes (of growing lanes, of random ids, of
// more lanes than are kept), no stored id is above its bound. And ids that
// grow within their lane are above it even while lanes interleave, as the
// ids of several coordinators' sonyflake generators do.
func TestHorizonLanes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var stored []uint64
		for range rng.IntN(20) {
			stored = append(stored, rng.Uint64N(1<<40))
		}
		base := uint64(0)
		for _, id := range stored {
			base = max(base, id)
		}
		h := &horizon{base: base, max: base, lanes: map[uint16]uint64{}}
		lanes := 1 + rng.IntN(2*maxLanes) // past maxLanes: folded
		next := make([]uint64, lanes)     // each lane's next id, growing
		mixed := map[uint16]bool{}        // lanes a client's id fell into
		for i := range next {
			next[i] = base>>16<<16 + uint64(i)
		}
		for range 2000 {
			var id uint64
			if rng.IntN(10) == 0 {
				id = rng.Uint64() // a client's id
				mixed[lane(id)] = true
			} else {
				l := rng.IntN(lanes)
				next[l] += uint64(1+rng.IntN(4)) << 16
				id = next[l]
				if h.lanes != nil && !mixed[lane(id)] && id <= h.bound(id) {
					t.Fatalf("round %d: id %d grows its lane %d but is not above its bound %d", round, id, lane(id), h.bound(id))
				}
			}
			h.note(id)
			stored = append(stored, id)
		}
		for _, id := range stored {
			if id > h.bound(id) {
				t.Fatalf("round %d: stored id %d is above its bound %d (lanes kept: %v)", round, id, h.bound(id), h.lanes != nil)
			}
		}
		if lanes+2000/10 < maxLanes/2 && h.lanes == nil {
			t.Fatalf("round %d: folded with %d lanes", round, lanes)
		}
	}
}
