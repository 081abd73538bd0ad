package dispatch

import (
	"slices"
	"testing"
	"time"
)

// The cache holds at most its size, evicting the least recently used id;
// putting an id it holds again does not grow it.
func TestDepCacheBound(t *testing.T) {
	c := newDepCache(3)
	c.put(1, DepCompleted)
	c.put(2, DepFailed)
	c.put(3, DepCompleted)
	if o, ok := c.get(1); !ok || o != DepCompleted { // 1 is now the most recent
		t.Fatalf("get(1) = %v, %v", o, ok)
	}
	c.put(3, DepCompleted)
	c.put(4, DepCompleted) // evicts 2, the least recently used
	if c.len() != 3 {
		t.Fatalf("len %d, want 3", c.len())
	}
	for _, tc := range []struct {
		id   uint64
		want DepOutcome
		ok   bool
	}{{1, DepCompleted, true}, {2, DepUndecided, false}, {3, DepCompleted, true}, {4, DepCompleted, true}} {
		if o, ok := c.get(tc.id); o != tc.want || ok != tc.ok {
			t.Errorf("get(%d) = %v, %v; want %v, %v", tc.id, o, ok, tc.want, tc.ok)
		}
	}
	for id := range uint64(1000) {
		c.put(100+id, DepFailed)
		if c.len() > 3 {
			t.Fatalf("len %d after %d puts, want at most 3", c.len(), id+1)
		}
	}
}

// The watch reads a dependency elsewhere at once, one with a replica here
// after depRecheckHosted, then backs off to depRecheckMax; it holds at most
// its max ids and forgets those no claim asked about for depForget.
func TestDepWatchSchedule(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := depWatch{max: 3}
	if !w.want(1, false, t0) || !w.want(2, true, t0) || w.want(1, false, t0) {
		t.Fatal("want reports new ids wrong")
	}
	// Reads of id 1 (elsewhere): at once, then 250ms, 500ms, 1s, ... 5s apart.
	var reads1, reads2 []time.Duration
	for at := time.Duration(0); at <= 20*time.Second; at += 50 * time.Millisecond {
		for _, id := range w.take(t0.Add(at)) {
			if id == 1 {
				reads1 = append(reads1, at)
			} else {
				reads2 = append(reads2, at)
			}
		}
	}
	ms := func(ds ...int) (out []time.Duration) {
		for _, d := range ds {
			out = append(out, time.Duration(d)*time.Millisecond)
		}
		return out
	}
	if want := ms(0, 250, 750, 1750, 3750, 7750, 12750, 17750); !slices.Equal(reads1, want) {
		t.Errorf("reads of a dependency elsewhere at %v, want %v", reads1, want)
	}
	if want := ms(1000, 3000, 7000, 12000, 17000); !slices.Equal(reads2, want) {
		t.Errorf("reads of a dependency with a replica here at %v, want %v", reads2, want)
	}
	if due, ok := w.next(); !ok || due != t0.Add(22*time.Second) {
		t.Errorf("next due %v, %v", due, ok)
	}
	// Full: 3 and 4 do not both fit.
	if !w.want(3, false, t0) || w.want(4, false, t0) || len(w.ids) != 3 {
		t.Fatalf("watch of max 3 holds %d", len(w.ids))
	}
	w.settle(3)
	// 2 is asked about again later than 1: 1 is forgotten first.
	w.want(2, true, t0.Add(time.Minute))
	w.take(t0.Add(depForget + time.Second))
	if _, ok := w.ids[1]; ok || len(w.ids) != 1 {
		t.Fatalf("after depForget the watch holds %v", w.ids)
	}
	w.take(t0.Add(time.Minute + depForget + time.Second))
	if _, ok := w.next(); ok {
		t.Fatalf("nothing asked about is still watched: %v", w.ids)
	}
}
