package storage

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/norn-dev/norn/crdt"
)

// diskRow reads id's task and meta keys and claim record from Pebble, past
// the row cache.
func diskRow(t *testing.T, s *Store, p uint16, id uint64) row {
	t.Helper()
	enc, err := s.get(taskKey(p, id))
	if errors.Is(err, ErrNotFound) {
		enc = nil
	} else if err != nil {
		t.Fatal(err)
	}
	r := row{enc: enc}
	mv, err := s.get(metaKey(p, id))
	if err == nil {
		m, ok := decodeMeta(mv)
		if !ok {
			t.Fatalf("bad meta %x", mv)
		}
		r.m, r.mFound = m, true
	} else if !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	rec, err := s.get(fsmRecordKey(p, id))
	if err == nil {
		r.rec = rec
	} else if !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	r.recKnown = true
	return r
}

// The row cache never disagrees with the disk: random merges (new tasks,
// updates, terminal events), claim FSM moves and records, the FSM's reads
// of records, snapshot restores, releases, deletions and partition drops,
// with every id checked after every step; and the cache answers reads (it
// is not empty throughout, and knows records).
func TestRowCacheFollowsWrites(t *testing.T) {
	s, clk := memStore(t)
	rng := rand.New(rand.NewPCG(7, 11))
	const ids = 24
	part := func(id uint64) uint16 { return uint16(id % 2) }
	hits, recHits := 0, 0
	record := func(step int) []byte {
		if rng.IntN(4) == 0 {
			return nil // a deletion (OpForget)
		}
		return []byte{'r', byte(step), byte(step >> 8)}
	}
	for step := range 4000 {
		id := uint64(rng.IntN(ids) + 1)
		p := part(id)
		var err error
		switch op := rng.IntN(13); op {
		case 0, 1:
			_, err = s.MergeTask(p, newTask(id, "q", int32(rng.IntN(3))))
		case 2:
			_, err = s.MergeTask(p, &crdt.Task{ID: id, Updates: []crdt.Update{{At: crdt.Timestamp{WallMs: clk.ms + int64(step), Node: 1}, Claim: 1, Seq: uint64(step), Progress: 0.5, Data: []byte{byte(step)}}}})
		case 3:
			_, err = s.MergeTask(p, &crdt.Task{ID: id, Terminals: []crdt.Terminal{{Kind: crdt.Completed, At: crdt.Timestamp{WallMs: clk.ms + int64(step), Node: 1}, Claim: uint64(step)}}})
		case 4:
			err = s.MarkClaimed(p, []ClaimMark{{ID: id, ExpiryMs: clk.ms + int64(rng.IntN(1000))}})
		case 5:
			err = s.ReleaseClaims(p, []uint64{id})
		case 6:
			err = s.ApplyClaimFSM(p, ClaimFSMUpdate{AppliedIndex: uint64(step), Moves: []IndexMove{{ID: id, Claimed: rng.IntN(2) == 0, ExpiryMs: clk.ms + 5}}}, false)
		case 7:
			err = s.DeleteTasks(p, []uint64{id})
		case 8:
			// A locked read fills the cache; a lock-free one only looks.
			unlock := s.lockIDs([]uint64{id})
			_, err = s.loadIndex(p, id)
			unlock()
			if err == nil {
				_, err = s.TaskState(p, id)
				if errors.Is(err, ErrNotFound) {
					err = nil
				}
			}
		case 9:
			if rng.IntN(20) == 0 {
				if err = s.DropPartition(p); err == nil {
					s.ReopenPartition(p)
				}
			}
		case 10:
			err = s.ApplyClaimFSM(p, ClaimFSMUpdate{AppliedIndex: uint64(step), Records: []FSMRecord{{ID: id, Value: record(step)}}}, false)
		case 11:
			_, err = s.ClaimFSMRecordForApply(p, id)
			if errors.Is(err, ErrNotFound) {
				err = nil
			}
		case 12:
			if rng.IntN(10) == 0 {
				var recs []FSMRecord
				for i := uint64(1); i <= ids; i++ {
					if v := record(step); part(i) == p && v != nil {
						recs = append(recs, FSMRecord{ID: i, Value: v})
					}
				}
				err = s.RestoreClaimFSM(p, uint64(step), recs, nil, nil, nil)
			}
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("step %d op on %d: %v", step, id, err)
		}
		for i := uint64(1); i <= ids; i++ {
			c, ok := s.rows.lookup(part(i), i)
			if !ok {
				continue
			}
			hits++
			d := diskRow(t, s, part(i), i)
			if !bytes.Equal(c.enc, d.enc) || c.m != d.m || c.mFound != d.mFound {
				t.Fatalf("step %d: task %d cached %+v, on disk %+v", step, i, c, d)
			}
			if c.recKnown {
				recHits++
				if !bytes.Equal(c.rec, d.rec) || (c.rec == nil) != (d.rec == nil) {
					t.Fatalf("step %d: record of %d cached %q, on disk %q", step, i, c.rec, d.rec)
				}
			}
		}
	}
	if hits == 0 || recHits == 0 {
		t.Fatalf("the cache held %d rows and %d records over the steps", hits, recHits)
	}
}

// A fill that read before a partition drop does not bring the dropped
// rows back.
func TestRowCacheDropBeatsStaleFill(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 3, newTask(5, "q", 0))
	s.rows.dropPartition(3) // start uncached
	gen := s.rows.gen(3)
	r := diskRow(t, s, 3, 5)
	if err := s.DropPartition(3); err != nil {
		t.Fatal(err)
	}
	s.rows.fill(3, 5, r, gen)
	if _, ok := s.rows.lookup(3, 5); ok {
		t.Fatal("a fill from before the drop was cached")
	}
	if _, err := s.GetTask(3, 5); !errors.Is(err, ErrNotFound) {
		t.Fatalf("dropped task read back: %v", err)
	}
}

// The cache stays within its bound: its capacity rounded up to whole
// sets (a power of two of them per shard), and the rows it keeps are the
// ones filled last.
func TestRowCacheBounded(t *testing.T) {
	const capacity = rowShards * rowWays * 4
	c := newRowCache(capacity)
	for id := range uint64(10_000) {
		c.fill(0, id, row{enc: []byte{1}, mFound: true}, 0)
	}
	n := 0
	for i := range c.shards {
		n += c.shards[i].len()
	}
	if n != capacity {
		t.Fatalf("%d rows cached after 10,000 fills, want the bound %d", n, capacity)
	}
	// Each set evicts its oldest: the last ids filled are all there.
	for id := uint64(10_000 - capacity/4); id < 10_000; id++ {
		if _, ok := c.lookup(0, id); !ok {
			t.Fatalf("id %d, among the last filled, was evicted", id)
		}
	}
}

// TestRowCacheKeepsSonyflakeIDs: ids as sonyflake makes them at a low
// rate (3 coordinators, 5 ids per 10 ms tick each: the sequence bits stay
// small and the low bits are the machine id) spread over the shards and
// sets, so a cache of twice capacity rows keeps nearly every one of
// capacity such ids. Before, they crowded 4 of the 64 shards and the cache
// kept a sixteenth of them.
func TestRowCacheKeepsSonyflakeIDs(t *testing.T) {
	const capacity = 1 << 14
	c := newRowCache(2 * capacity) // the slack of an uneven hash
	var ids []uint64
	for tick := uint64(0); len(ids) < capacity; tick++ {
		for machine := uint64(1); machine <= 3 && len(ids) < capacity; machine++ {
			for seq := uint64(0); seq < 5 && len(ids) < capacity; seq++ {
				ids = append(ids, (1_000_000+tick)<<24|seq<<16|machine)
			}
		}
	}
	for _, id := range ids {
		c.fill(0, id, row{enc: []byte{1}}, c.gen(0))
	}
	kept := 0
	for _, id := range ids {
		if _, ok := c.lookup(0, id); ok {
			kept++
		}
	}
	// A set-associative cache loses a few to sets that overflow (about 1%
	// at half its capacity); crowded shards lost fifteen sixteenths.
	if kept < len(ids)*98/100 {
		t.Fatalf("the cache kept %d of %d ids, want at least 98%%", kept, len(ids))
	}
}
