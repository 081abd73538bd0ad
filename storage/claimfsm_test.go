package storage

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestApplyClaimFSM(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 0))
	if a, err := s.ClaimFSMApplied(0); a != 0 || err != nil {
		t.Fatalf("applied on an empty FSM = %d, %v", a, err)
	}
	err := s.ApplyClaimFSM(0, ClaimFSMUpdate{
		AppliedIndex: 7,
		Records:      []FSMRecord{{ID: 1, Value: []byte("r1")}, {ID: 3, Value: []byte("r3")}},
		Moves: []IndexMove{
			{ID: 1, Claimed: true, ExpiryMs: t0 + 10},
			{ID: 3, Claimed: true, ExpiryMs: t0 + 20}, // not stored here yet
			{ID: 2, Claimed: true, ExpiryMs: t0 + 5},
			{ID: 2}, // claimed and released within the batch
		},
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := s.ClaimFSMApplied(0); a != 7 {
		t.Fatalf("applied = %d, want 7", a)
	}
	if v, _ := s.ClaimFSMRecord(0, 3); string(v) != "r3" {
		t.Fatalf("record 3 = %q", v)
	}
	if _, err := s.ClaimFSMRecord(0, 2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("record 2: %v", err)
	}
	due, _ := s.ClaimsExpiring(0, t0+100, 10)
	if len(due) != 2 || due[0].ID != 1 || due[1].ID != 3 {
		t.Fatalf("claimed index = %v, want 1 and 3", due)
	}
	if got := headIDs(t, s, 0, "q", 10); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("ready = %v, want [2]", got)
	}
	// The task that was claimed before it arrived stays claimed on arrival.
	mustMerge(t, s, 0, newTask(3, "q", 0))
	if st, _ := s.GetTask(0, 3); st.Index != IndexClaimed || st.ExpiryMs != t0+20 {
		t.Fatalf("task 3 on arrival: %+v", st)
	}
	// Deleting a record.
	if err := s.ApplyClaimFSM(0, ClaimFSMUpdate{AppliedIndex: 8, Records: []FSMRecord{{ID: 1}}}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimFSMRecord(0, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted record: %v", err)
	}
	checkIndexes(t, s, 0)
}

// TestClaimFSMSnapshotRestore snapshots one store's FSM and restores it into
// another whose claims differ: afterwards records, applied index and
// claimed index equal the snapshot's.
func TestClaimFSMSnapshotRestore(t *testing.T) {
	src, _ := memStore(t)
	dst, _ := memStore(t)
	r := rand.New(rand.NewPCG(5, 5))
	var tasks []uint64
	for i := range 40 {
		id := uint64(i + 1)
		tasks = append(tasks, id)
		mustMerge(t, src, 0, newTask(id, "q", 0))
		mustMerge(t, dst, 0, newTask(id, "q", 0))
	}
	apply := func(s *Store, idx uint64) {
		var u ClaimFSMUpdate
		u.AppliedIndex = idx
		for _, id := range tasks {
			if r.IntN(3) == 0 {
				u.Records = append(u.Records, FSMRecord{ID: id, Value: []byte{byte(idx), byte(id)}})
				u.Moves = append(u.Moves, IndexMove{ID: id, Claimed: true, ExpiryMs: t0 + int64(r.IntN(100))})
			}
		}
		if err := s.ApplyClaimFSM(0, u, false); err != nil {
			t.Fatal(err)
		}
	}
	apply(src, 10)
	apply(dst, 3)
	_, before, err := dst.ClaimFSMDigest(0)
	if err != nil {
		t.Fatal(err)
	}

	snap := src.SnapshotClaimFSM(0)
	defer snap.Close()
	applied, err := snap.Applied()
	if err != nil {
		t.Fatal(err)
	}
	var recs []FSMRecord
	if err := snap.Records(func(id uint64, v []byte) error {
		recs = append(recs, FSMRecord{ID: id, Value: slices.Clone(v)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	live, _ := src.ClaimsExpiring(0, t0+1000, 1000)
	var marks []ClaimMark
	for _, d := range live {
		marks = append(marks, ClaimMark{ID: d.ID, ExpiryMs: d.AtMs})
	}
	if err := dst.RestoreClaimFSM(0, applied, recs, marks, nil, nil); err != nil {
		t.Fatal(err)
	}
	if a, _ := dst.ClaimFSMApplied(0); a != 10 {
		t.Fatalf("applied after restore = %d", a)
	}
	// The digests of equal FSMs are equal, those of different ones not.
	sa, sd, err1 := src.ClaimFSMDigest(0)
	da, dd, err2 := dst.ClaimFSMDigest(0)
	if err1 != nil || err2 != nil || sa != 10 || da != 10 || sd != dd || dd == before {
		t.Fatalf("digests: src %d/%x/%v, dst %d/%x/%v (before restore %x)", sa, sd, err1, da, dd, err2, before)
	}
	got, _ := dst.ClaimsExpiring(0, t0+1000, 1000)
	if !slices.Equal(got, live) {
		t.Fatalf("claimed after restore = %v, want %v", got, live)
	}
	for _, id := range tasks {
		a, errA := src.ClaimFSMRecord(0, id)
		b, errB := dst.ClaimFSMRecord(0, id)
		if string(a) != string(b) || (errA == nil) != (errB == nil) {
			t.Fatalf("record %d: %x/%v vs %x/%v", id, a, errA, b, errB)
		}
	}
	checkIndexes(t, dst, 0)
	if err := dst.ApplyClaimFSM(0, ClaimFSMUpdate{AppliedIndex: 11, Records: []FSMRecord{{ID: tasks[0], Value: []byte("x")}}}, false); err != nil {
		t.Fatal(err)
	}
	if _, d, _ := dst.ClaimFSMDigest(0); d == sd {
		t.Fatalf("digest unchanged by a changed record")
	}

}

// TestClaimFSMBatchIsAtomic crashes after an unsynced FSM batch: the crashed
// store holds all of it or none of it.
func TestClaimFSMBatchIsAtomic(t *testing.T) {
	for seed := range uint64(8) {
		fs := vfs.NewCrashableMem()
		s, _ := openTestStore(t, fs, "db")
		mustMerge(t, s, 0, newTask(1, "q", 0))
		u := ClaimFSMUpdate{AppliedIndex: 5, Records: []FSMRecord{{ID: 1, Value: []byte("x")}},
			Moves: []IndexMove{{ID: 1, Claimed: true, ExpiryMs: t0}}}
		if err := s.ApplyClaimFSM(0, u, false); err != nil {
			t.Fatal(err)
		}
		crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, 1))})
		s2, _ := openTestStore(t, crashed, "db")
		applied, _ := s2.ClaimFSMApplied(0)
		_, recErr := s2.ClaimFSMRecord(0, 1)
		st, err := s2.GetTask(0, 1)
		if err != nil {
			t.Fatal(err)
		}
		all := applied == 5 && recErr == nil && st.Index == IndexClaimed
		none := applied == 0 && errors.Is(recErr, ErrNotFound) && st.Index == IndexReady
		if !all && !none {
			t.Fatalf("seed %d: torn batch: applied=%d record err=%v index=%v", seed, applied, recErr, st.Index)
		}
		checkIndexes(t, s2, 0)
	}
}
