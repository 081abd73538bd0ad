package storage

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
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

func TestSegmentIndex(t *testing.T) {
	s, _ := memStore(t)
	want := map[uint64]uint64{}
	for i := range 50 {
		res := mustMerge(t, s, 0, newTask(uint64(i+1), "q", 0))
		want[uint64(i+1)] = res[0].NewDigest
	}
	res := mustMerge(t, s, 0, cancelOf(3, t0))
	want[3] = res[0].NewDigest
	got := map[uint64]uint64{}
	prev := -1
	err := s.ScanSegments(0, 0, 1<<16, func(seg uint16, e SegmentEntry) error {
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
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("segment index %v, want %v", got, want)
	}
	// A sub-range returns exactly the ids in it.
	n := 0
	_ = s.ScanSegments(0, 0, 1<<15, func(seg uint16, _ SegmentEntry) error {
		if seg >= 1<<15 {
			t.Errorf("segment %d outside [0, 32768)", seg)
		}
		n++
		return nil
	})
	if n == 0 || n == len(want) {
		t.Fatalf("half-range scan saw %d of %d entries", n, len(want))
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
