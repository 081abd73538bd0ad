package storage

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// TestCheckpoint checks that a checkpoint opens as a store holding what
// was merged before it, ready index and counters included, and nothing
// merged after.
func TestCheckpoint(t *testing.T) {
	fs := vfs.NewMem()
	s, _ := openTestStore(t, fs, "db")
	mustMerge(t, s, 1, newTask(10, "q", 0), newTask(11, "q", 5))
	mustMerge(t, s, 1, cancelOf(10, t0+1))
	if err := s.Checkpoint("ckpt"); err != nil {
		t.Fatal(err)
	}
	mustMerge(t, s, 1, newTask(12, "q", 0))
	if err := s.Checkpoint("ckpt"); err == nil {
		t.Errorf("a second checkpoint into the same directory succeeded")
	}

	c, _ := openTestStore(t, fs, "ckpt")
	got, err := c.TaskState(1, 11)
	if err != nil || got.Spec == nil || string(got.Spec.Payload) != "payload-11" {
		t.Fatalf("task 11 in the checkpoint: %+v, %v", got, err)
	}
	if got, err := c.TaskState(1, 10); err != nil {
		t.Errorf("task 10 in the checkpoint: %v", err)
	} else if ev, ok := got.Terminal(); !ok || ev.Kind != crdt.Cancelled {
		t.Errorf("task 10 in the checkpoint is not cancelled: %+v", got)
	}
	if _, err := c.TaskState(1, 12); !errors.Is(err, ErrNotFound) {
		t.Errorf("task 12, merged after the checkpoint: %v, want ErrNotFound", err)
	}
	counts, err := c.Counts(1, "q")
	want := []CountEntry{{Queue: "q", Class: ClassReady, N: 1}, {Queue: "q", Class: ClassCancelled, N: 1}}
	if err != nil || len(counts) != 2 || counts[0] != want[0] || counts[1] != want[1] {
		t.Errorf("the checkpoint's counts: %v, %v; want %v", counts, err, want)
	}

	s.Close()
	if err := s.Checkpoint("after-close"); !errors.Is(err, ErrClosed) {
		t.Errorf("Checkpoint after Close: %v, want ErrClosed", err)
	}
}
