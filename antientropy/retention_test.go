package antientropy

import (
	"context"
	"errors"
	"maps"
	"testing"

	"github.com/norn-dev/norn/crdt"
)

// inQueue is newTask(id) in queue q.
func inQueue(id uint64, q string) *crdt.Task {
	t := newTask(id)
	t.Spec.Queue = q
	return t
}

// TestExchangeQueueRetention: with a queue whose retention is its own,
// the replicas agree on the later horizon of each queue: a task of the
// short queue past it is deleted on both, one of another queue of the
// same age is kept on both; and replicas on different versions of the
// queue settings skip the round, deleting nothing.
func TestExchangeQueueRetention(t *testing.T) {
	const (
		old     = t0 - 10_000 // the terminal events
		early   = t0 - 20_000 // the default horizon: keeps them
		shortA  = t0 - 5_000  // queue short's horizon on A
		shortB  = t0 - 15_000 // on B (its clock is behind)
		version = 7
	)
	load := func(s *side) {
		for id := uint64(1); id <= 40; id++ {
			q := "short"
			if id > 20 {
				q = "other"
			}
			mergeAll(t, s.store, 0, inQueue(id, q), terminalOf(id, old, crdt.Completed, 1))
		}
	}
	t.Run("agree", func(t *testing.T) {
		a := newSide(t, sideConfig{horizon: early, queues: map[string]int64{"short": shortA}, version: version}, 0)
		b := newSide(t, sideConfig{horizon: early, queues: map[string]int64{"short": shortB}, version: version}, 0)
		load(a)
		load(b)
		if _, err := b.r.Exchange(context.Background(), a.peer, []uint16{0}, Options{}); err != nil {
			t.Fatal(err)
		}
		for name, s := range map[string]*side{"A": a, "B": b} {
			got := stored(t, s.store, 0)
			if len(got) != 20 {
				t.Fatalf("%s holds %d tasks, want the 20 of queue other", name, len(got))
			}
			for id := range got {
				if id <= 20 {
					t.Fatalf("%s kept task %d of queue short", name, id)
				}
			}
			if h := s.store.DeleteHorizons(); h.Of("short") != shortA || h.Default != early {
				t.Fatalf("%s's delete horizons %+v, want short at A's (the later) and the default", name, h)
			}
		}
	})
	t.Run("versions differ", func(t *testing.T) {
		a := newSide(t, sideConfig{horizon: early, queues: map[string]int64{"short": shortA}, version: version}, 0)
		b := newSide(t, sideConfig{horizon: early, version: version - 1}, 0)
		load(a)
		load(b)
		before := stored(t, b.store, 0)
		for _, dir := range []struct{ caller, peer *side }{{a, b}, {b, a}} {
			_, err := dir.caller.r.Exchange(context.Background(), dir.peer.peer, []uint16{0}, Options{})
			if !errors.Is(err, ErrQueuesVersion) {
				t.Fatalf("exchange across versions: %v, want ErrQueuesVersion", err)
			}
		}
		if got := stored(t, b.store, 0); !maps.Equal(got, before) {
			t.Fatal("a round refused for its versions deleted tasks")
		}
	})
	t.Run("no queue retention, versions may differ", func(t *testing.T) {
		a := newSide(t, sideConfig{horizon: early, version: 3}, 0)
		b := newSide(t, sideConfig{horizon: early, version: 4}, 0)
		load(a)
		if _, err := a.r.Exchange(context.Background(), b.peer, []uint16{0}, Options{}); err != nil {
			t.Fatal(err)
		}
		if got := stored(t, b.store, 0); len(got) != 40 {
			t.Fatalf("B holds %d tasks after the round, want 40", len(got))
		}
	})
}
