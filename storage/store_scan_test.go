package storage

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func TestScanTasksPagesAndDropPartition(t *testing.T) {
	s, _ := memStore(t)
	var ids []uint64
	for i := range 25 {
		id := uint64(i*7 + 1)
		ids = append(ids, id)
		mustMerge(t, s, 2, newTask(id, "q", 0))
	}
	mustMerge(t, s, 1, newTask(1000, "q", 0))
	mustMerge(t, s, 3, newTask(2000, "q", 0))
	var got []uint64
	start, pages := uint64(0), 0
	for {
		page, next, more, err := s.ScanTasks(2, start, 10)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, st := range page {
			got = append(got, st.Task.ID)
		}
		if !more {
			break
		}
		start = next
	}
	if !slices.Equal(got, ids) || pages != 3 {
		t.Fatalf("scanned %v in %d pages", got, pages)
	}
	if err := s.DropPartition(2); err != nil {
		t.Fatal(err)
	}
	if page, _, _, _ := s.ScanTasks(2, 0, 10); len(page) != 0 {
		t.Fatalf("partition 2 not dropped: %d tasks", len(page))
	}
	if h := headIDs(t, s, 2, "q", 10); len(h) != 0 {
		t.Fatalf("ready index of a dropped partition: %v", h)
	}
	for p, id := range map[uint16]uint64{1: 1000, 3: 2000} {
		if _, err := s.GetTask(p, id); err != nil {
			t.Fatalf("neighbour partition %d lost task: %v", p, err)
		}
		checkIndexes(t, s, p)
	}
}

// The segment index lists every stored task with its digest, in
// (segment, id) order, whether the partition is tracked (read from memory)
// or not (computed from the task keys), through merges and deletes, and
// tracking sees the same set through its sink.
func TestSegmentIndex(t *testing.T) {
	s, _ := memStore(t)
	want := map[uint64]uint64{}
	for i := range 50 {
		res := mustMerge(t, s, 0, newTask(uint64(i+1), "q", 0))
		want[uint64(i+1)] = res[0].NewDigest
	}
	check := func(when string) {
		t.Helper()
		got := map[uint64]uint64{}
		prev := -1
		err := s.ScanSegmentRanges(0, []SegmentRange{{0, 1 << 16}}, func(seg uint16, e SegmentEntry) error {
			if int(seg) < prev || seg != Segment(e.ID) {
				return fmt.Errorf("entry %d in segment %d out of order or misplaced", e.ID, seg)
			}
			prev = int(seg)
			got[e.ID] = e.Digest
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("%s: segment index %v, want %v", when, got, want)
		}
		// A sub-range returns exactly the ids in it.
		n := 0
		_ = s.ScanSegmentRanges(0, []SegmentRange{{0, 1 << 15}}, func(seg uint16, _ SegmentEntry) error {
			if seg >= 1<<15 {
				t.Errorf("segment %d outside [0, 32768)", seg)
			}
			n++
			return nil
		})
		if n == 0 || n == len(want) {
			t.Fatalf("%s: half-range scan saw %d of %d entries", when, n, len(want))
		}
		// Several ranges at once return exactly the ids in them, in order.
		ranges := []SegmentRange{{0, 9000}, {20000, 20000}, {30000, 45000}, {60000, 1 << 16}}
		var wantIn []uint64
		for id := range want {
			for _, r := range ranges {
				if seg := uint32(Segment(id)); r.Lo <= seg && seg < r.Hi {
					wantIn = append(wantIn, id)
				}
			}
		}
		slices.SortFunc(wantIn, func(a, b uint64) int { return cmp.Or(cmp.Compare(Segment(a), Segment(b)), cmp.Compare(a, b)) })
		var gotIn []uint64
		err = s.ScanSegmentRanges(0, ranges, func(seg uint16, e SegmentEntry) error {
			if e.Digest != want[e.ID] {
				t.Errorf("%s: id %d with digest %x, want %x", when, e.ID, e.Digest, want[e.ID])
			}
			gotIn = append(gotIn, e.ID)
			return nil
		})
		if err != nil || !slices.Equal(gotIn, wantIn) || len(wantIn) == 0 {
			t.Fatalf("%s: ranges %v gave %v, want %v (%v)", when, ranges, gotIn, wantIn, err)
		}
	}
	check("untracked")
	sink := &setSink{m: map[uint64]uint64{}}
	if err := s.TrackDigests(0, sink); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(sink.m, want) {
		t.Fatalf("tracking loaded %v, want %v", sink.m, want)
	}
	check("tracked")
	res := mustMerge(t, s, 0, cancelOf(3, t0))
	want[3] = res[0].NewDigest
	if err := s.DeleteTasks(0, []uint64{7, 8}); err != nil {
		t.Fatal(err)
	}
	delete(want, 7)
	delete(want, 8)
	check("tracked, after a change and deletes")
	if !maps.Equal(sink.m, want) {
		t.Fatalf("the sink holds %v, want %v", sink.m, want)
	}
	s.UntrackDigests(0)
	check("untracked again")
	// Nothing of it is stored as keys of its own.
	lo, hi := tagSpan(0, tagSegment)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	if it.First() {
		t.Fatalf("a segment index key is stored: %x", it.Key())
	}
}

// setSink is a DigestSink that keeps the (id -> digest) set it is told.
type setSink struct {
	mu sync.Mutex
	m  map[uint64]uint64
}

func (k *setSink) DigestChanged(_ uint16, id uint64, _ uint64, _ bool, new uint64, has bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if has {
		k.m[id] = new
	} else {
		delete(k.m, id)
	}
}

func TestCorruptValuesGiveErrors(t *testing.T) {
	s, _ := memStore(t)
	mustMerge(t, s, 0, newTask(1, "q", 0), newTask(2, "q", 0))
	if err := s.db.Set(taskKey(0, 1), []byte{1, 2, 3}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Set(metaKey(0, 2), []byte{7}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	// Read the disk as a restarted node would, not the rows cached by the
	// merge above.
	s.rows.dropPartition(0)
	for _, id := range []uint64{1, 2} {
		_, err := s.GetTask(0, id)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "key ") {
			t.Fatalf("task %d: err = %v, want ErrCorrupt naming the key", id, err)
		}
	}
	if _, err := s.MergeTask(0, newTask(1, "q", 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("merge into corrupt state: %v", err)
	}
	if _, _, _, err := s.ScanTasks(0, 0, 10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("scan over corrupt state: %v", err)
	}
	// The corrupt value is left as it was: nothing overwrote it.
	v, _ := s.get(taskKey(0, 1))
	if !bytes.Equal(v, []byte{1, 2, 3}) {
		t.Fatalf("corrupt value was overwritten: %x", v)
	}
}
