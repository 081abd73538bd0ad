package storage

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestCrashKeepsAckedWrites runs Pebble on a crashable filesystem and
// crashes it (unsynced data dropped at random) twice: right after a burst of
// concurrent acked merges, and after acked claims with unsynced writes in
// flight. Every acked write must survive each crash, and the indexes must
// agree with the tasks.
func TestCrashKeepsAckedWrites(t *testing.T) {
	for round := range 3 {
		t.Run(fmt.Sprint("round", round), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			s, _ := openTestStore(t, fs, "db")
			r := rand.New(rand.NewPCG(uint64(round), 3))
			crash := func() vfs.FS {
				return fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(r.Uint64(), 4))})
			}
			acked := map[uint64]uint64{} // id -> digest
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := range 50 {
						id := uint64(w*1000 + i + 1)
						res, err := s.MergeTask(uint16(id%4), newTask(id, "q", int32(i%3)))
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						acked[id] = res.NewDigest
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			afterMerges := crash()
			checkCrashed(t, afterMerges, "db", acked, nil)

			claimed := map[uint64]int64{}
			for id := range acked {
				if r.IntN(4) == 0 {
					exp := t0 + int64(r.IntN(1000))
					if err := s.MarkClaimed(uint16(id%4), []ClaimMark{{id, exp}}); err != nil {
						t.Fatal(err)
					}
					claimed[id] = exp
				}
			}
			// Unsynced work in flight at the crash: may or may not survive.
			// They are whole merges (task and indexes in one batch, as
			// prepareMerge builds them) committed without a sync: a
			// background WAL sync may keep any of them, and then they must
			// be consistent too.
			for i := range 20 {
				id := uint64(90000 + i)
				_, b, _, _, _, err := s.prepareMerge([]MergeItem{{Partition: uint16(id % 4), Task: newTask(id, "q", 0)}})
				if err != nil {
					t.Fatal(err)
				}
				_ = b.Commit(pebble.NoSync)
				b.Close()
			}
			checkCrashed(t, crash(), "db", acked, claimed)
		})
	}
}

// checkCrashed opens the crashed store in dir on fs and checks that every
// acked task (and acked claim) is there and the indexes agree with the
// tasks.
func checkCrashed(t *testing.T, fs vfs.FS, dir string, acked map[uint64]uint64, claimed map[uint64]int64) {
	t.Helper()
	s, _ := openTestStore(t, fs, dir)
	defer func() { s.Close(); s.db = nil }()
	for id, dig := range acked {
		st, err := s.GetTask(uint16(id%4), id)
		if err != nil {
			t.Fatalf("acked task %d lost: %v", id, err)
		}
		if st.Digest != dig {
			t.Fatalf("task %d digest %x, acked %x", id, st.Digest, dig)
		}
		if exp, ok := claimed[id]; ok && (st.Index != IndexClaimed || st.ExpiryMs != exp) {
			t.Fatalf("task %d claim lost: %+v", id, st)
		}
	}
	for p := range uint16(4) {
		checkIndexes(t, s, p)
	}
}
