package check

import (
	"testing"
	"time"
)

func TestRetention(t *testing.T) {
	const (
		s         = int64(time.Second)
		retention = 10 * time.Second
		slack     = time.Second
		settle    = 2 * time.Second
	)
	enq := Op{F: "enqueue", Task: 1, Type: "ok", Call: 0, Return: s / 10}
	done := Op{F: "complete", Task: 1, Type: "ok", Call: 4 * s, Return: 4*s + s/10}
	found := func(f string, at int64) Op { return Op{F: f, Task: 1, Type: "ok", Call: at, Return: at + s/100} }
	gone := func(f string, at int64) Op {
		return Op{F: f, Task: 1, Type: "fail", Err: "not_found: task 1", Call: at, Return: at + s/100}
	}
	for _, c := range []struct {
		name  string
		ops   []Op
		valid bool
		count string
	}{
		{"deleted after retention", []Op{enq, done, found("read", 5*s), gone("read", 14*s), gone("final", 20*s)}, true, ""},
		// A quorum read may meet a replica whose pass has not run yet.
		{"found again within settle", []Op{enq, done, gone("read", 14*s), found("read", 15*s), gone("final", 20*s)}, true, ""},
		{"deleted early (counted from the enqueue)", []Op{enq, done, gone("read", 10*s+s/2), gone("final", 20*s)}, false, "early"},
		{"never completed, gone", []Op{enq, gone("read", 3*s)}, false, "early"},
		{"an indeterminate complete counts", []Op{enq, {F: "complete", Task: 1, Type: "info", Call: 4 * s, Return: -1}, gone("read", 14*s)}, true, ""},
		{"reappeared", []Op{enq, done, gone("read", 14*s), found("read", 17*s)}, false, "reappeared"},
		{"reappeared at the final read", []Op{enq, done, gone("read", 14*s), found("final", 20*s)}, false, "reappeared"},
		{"kept", []Op{enq, done, found("final", 17*s)}, false, "kept"},
		{"final read too soon to tell", []Op{enq, done, found("final", 15*s)}, true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Retention(c.ops, retention, slack, settle)
			if v.Valid != c.valid || (c.count != "" && v.Counts[c.count] == 0) {
				t.Fatalf("valid %v, want %v (counts %v, %v)", v.Valid, c.valid, v.Counts, v.Details)
			}
		})
	}
	if v := Retention([]Op{enq}, retention, slack, settle); v.Skipped == "" {
		t.Fatal("a history without a completed task is not skipped")
	}
}
