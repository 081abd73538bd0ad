package crdt

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// manualClock is a Clock the test moves by hand, backwards too.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) set(ms int64) {
	c.mu.Lock()
	c.t = time.UnixMilli(ms)
	c.mu.Unlock()
}

func TestHLCMonotonicWhenWallClockGoesBack(t *testing.T) {
	clk := &manualClock{}
	clk.set(1000)
	h := NewHLC(clk, 7)
	a := h.Now()
	if a != (Timestamp{WallMs: 1000, Node: 7}) {
		t.Fatalf("first reading %v", a)
	}
	b := h.Now() // same millisecond: logical ticks
	clk.set(900) // wall clock steps back
	c := h.Now()
	clk.set(2000)
	d := h.Now()
	for i, pair := range [][2]Timestamp{{a, b}, {b, c}, {c, d}} {
		if !pair[0].Less(pair[1]) {
			t.Errorf("step %d: %v not before %v", i, pair[0], pair[1])
		}
	}
	if c.WallMs != 1000 || c.Logical != 2 {
		t.Errorf("reading during step back = %v, want 1000.2", c)
	}
	if d != (Timestamp{WallMs: 2000, Node: 7}) {
		t.Errorf("reading after wall clock advanced = %v", d)
	}
}

func TestHLCUpdate(t *testing.T) {
	clk := &manualClock{}
	clk.set(1000)
	h := NewHLC(clk, 1)
	remote := Timestamp{WallMs: 5000, Logical: 3, Node: 2}
	got, err := h.Update(remote)
	if err != nil {
		t.Fatal(err)
	}
	if !remote.Less(got) || got.WallMs != 5000 || got.Logical != 4 || got.Node != 1 {
		t.Errorf("Update(%v) = %v, want 5000.4@1", remote, got)
	}
	if next := h.Now(); !got.Less(next) {
		t.Errorf("Now after Update = %v, not after %v", next, got)
	}
	// A remote reading behind local time still yields a later local reading.
	before := h.Last()
	got, _ = h.Update(Timestamp{WallMs: 10})
	if !before.Less(got) {
		t.Errorf("Update with old remote went backwards: %v -> %v", before, got)
	}
}

func TestHLCMaxForwardJump(t *testing.T) {
	clk := &manualClock{}
	clk.set(1000)
	h := NewHLC(clk, 1)
	h.SetMaxForwardJump(500 * time.Millisecond)
	before := h.Now()
	if _, err := h.Update(Timestamp{WallMs: 1501}); !errors.Is(err, ErrClockJump) {
		t.Fatalf("err = %v, want ErrClockJump", err)
	}
	if h.Last() != before {
		t.Errorf("clock moved on a refused update")
	}
	if _, err := h.Update(Timestamp{WallMs: 1500}); err != nil {
		t.Errorf("update within bound refused: %v", err)
	}
}

func TestHLCLogicalOverflowCarries(t *testing.T) {
	clk := &manualClock{}
	h := NewHLC(clk, 1)
	got, _ := h.Update(Timestamp{WallMs: 0, Logical: ^uint32(0)})
	if got != (Timestamp{WallMs: 1, Node: 1}) {
		t.Errorf("overflow: got %v", got)
	}
}

func TestHLCConcurrentReadingsUnique(t *testing.T) {
	clk := &manualClock{}
	clk.set(1)
	h := NewHLC(clk, 1)
	const workers, each = 8, 1000
	out := make(chan Timestamp, workers*each)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				out <- h.Now()
			}
		})
	}
	wg.Wait()
	close(out)
	seen := map[Timestamp]bool{}
	for ts := range out {
		if seen[ts] {
			t.Fatalf("duplicate reading %v", ts)
		}
		seen[ts] = true
	}
}

func TestTimestampCompare(t *testing.T) {
	tests := []struct {
		a, b Timestamp
		want int
	}{
		{Timestamp{1, 0, 0}, Timestamp{2, 0, 0}, -1},
		{Timestamp{2, 0, 0}, Timestamp{1, 9, 9}, 1},
		{Timestamp{1, 1, 0}, Timestamp{1, 2, 0}, -1},
		{Timestamp{1, 1, 2}, Timestamp{1, 1, 1}, 1},
		{Timestamp{1, 1, 1}, Timestamp{1, 1, 1}, 0},
		{Timestamp{-5, 0, 0}, Timestamp{0, 0, 0}, -1},
	}
	for _, tt := range tests {
		if got := tt.a.Compare(tt.b); got != tt.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
