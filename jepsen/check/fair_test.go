package check

import (
	"testing"
	"time"
)

// fairHistory: heavy claims every 10 ms from 0 to 2 s (each 5 ms long),
// and light tasks acked at the given times, each claimed after the given
// number of heavy claims.
func fairHistory(light map[int64]int) []Op {
	ms := int64(time.Millisecond)
	var ops []Op
	id := uint64(1000)
	for t := int64(0); t < 2000*ms; t += 10 * ms {
		id++
		ops = append(ops, Op{F: "claim", Type: "ok", Task: id, Key: "heavy", Call: t, Return: t + 5*ms})
	}
	n := uint64(0)
	for at, after := range light {
		n++
		ops = append(ops, Op{F: "enqueue", Type: "ok", Key: FairLight, Task: n, Call: at - ms, Return: at})
		// after heavy claims called 300 ms past the ack end before
		// the light claim's call.
		c := at + 300*ms + int64(after)*10*ms - 3*ms
		ops = append(ops, Op{F: "claim", Type: "ok", Key: FairLight, Task: n, Call: c, Return: c + 5*ms})
	}
	return ops
}

func TestFairness(t *testing.T) {
	ms := int64(time.Millisecond)
	ok := fairHistory(map[int64]int{100 * ms: 1, 500 * ms: 3, 900 * ms: 0, 1200 * ms: 6})
	if v := Fairness(ok, nil, 300*time.Millisecond, 6, time.Second); !v.Valid || v.Counts["judged"] != 4 || v.Counts["most-waited"] != 6 {
		t.Fatalf("light tasks within the bound: %+v", v)
	}
	late := fairHistory(map[int64]int{100 * ms: 1, 500 * ms: 20, 900 * ms: 0})
	if v := Fairness(late, nil, 300*time.Millisecond, 6, time.Second); v.Valid || v.Counts["over"] != 1 {
		t.Fatalf("a light task after 20 heavy claims passed: %+v", v)
	}
	// Inside a fault window it is not judged.
	late4 := fairHistory(map[int64]int{100 * ms: 1, 500 * ms: 20, 900 * ms: 0, 1300 * ms: 2})
	if v := Fairness(late4, [][2]int64{{450 * ms, 600 * ms}}, 300*time.Millisecond, 6, time.Second); !v.Valid || v.Counts["judged"] != 3 {
		t.Fatalf("a late light task inside a fault window was judged: %+v", v)
	}
	// Too few judged proves nothing.
	if v := Fairness(late, [][2]int64{{0, 2000 * ms}}, 300*time.Millisecond, 6, time.Second); v.Valid {
		t.Fatalf("a run with no light task judged passed: %+v", v)
	}
	// A light task never claimed while claims went on fails.
	lost := append(fairHistory(map[int64]int{100 * ms: 1, 500 * ms: 1, 900 * ms: 0}),
		Op{F: "enqueue", Type: "ok", Key: FairLight, Task: 99, Call: 200 * ms, Return: 201 * ms})
	if v := Fairness(lost, nil, 300*time.Millisecond, 6, time.Second); v.Valid || v.Counts["unclaimed"] != 1 {
		t.Fatalf("a light task never claimed passed: %+v", v)
	}
}
