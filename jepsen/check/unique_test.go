package check

import "testing"

func TestUnique(t *testing.T) {
	const s = int64(1e9)
	enq := func(task uint64, key string, dup bool, call, ret int64) Op {
		return Op{F: "enqueue", Type: "ok", Task: task, Key: key, Duplicate: dup, Call: call * s, Return: ret * s}
	}
	fin := func(task uint64, key, status string) Op {
		return Op{F: "final", Type: "ok", Task: task, Key: key, Payload: status}
	}
	gone := func(task uint64) Op { return Op{F: "final", Type: "fail", Task: task, Err: "not_found: task"} }
	complete := func(task uint64, call int64) Op {
		return Op{F: "complete", Type: "ok", Task: task, Call: call * s, Return: (call + 1) * s}
	}
	// A clean history: 1 holds k, a duplicate names it, 1 completes, 2
	// takes k; 3 was named by a failed enqueue and never stored, and a
	// duplicate of k2 names it (a phantom holder).
	clean := []Op{
		enq(1, "k", false, 0, 1), enq(1, "k", true, 2, 3), complete(1, 4), enq(2, "k", false, 6, 7),
		{F: "enqueue", Type: "info", Task: 3, Key: "k2", Call: 8 * s, Return: -1}, enq(3, "k2", true, 9, 10),
		fin(1, "k", "COMPLETED"), fin(2, "k", "READY"), gone(3),
	}
	if v := Unique(clean); !v.Valid || v.Counts["enqueued"] != 4 || v.Counts["duplicates"] != 2 {
		t.Fatalf("clean history: %+v", v)
	}
	for _, c := range []struct {
		name, count string
		ops         []Op
	}{
		{"a task behind a duplicate answer", "orphan", []Op{enq(1, "k", false, 0, 1), enq(1, "k", true, 2, 3), fin(1, "k", "READY"), fin(9, "k", "READY")}},
		{"created while the holder lives", "overlap", []Op{enq(1, "k", false, 0, 1), enq(2, "k", false, 2, 3), complete(1, 4), complete(2, 5), fin(1, "k", "COMPLETED"), fin(2, "k", "COMPLETED")}},
		{"two live at the end", "live-at-end", []Op{enq(1, "k", false, 0, 1), enq(2, "k", false, 0, 1), fin(1, "k", "READY"), fin(2, "k", "CLAIMED")}},
		{"answered another key's task", "wrong-key", []Op{enq(1, "k", false, 0, 1), enq(1, "other", true, 2, 3), fin(1, "k", "READY")}},
		{"a created task lost", "lost", []Op{enq(1, "k", false, 0, 1), gone(1)}},
		{"a duplicate of nothing", "dangling", []Op{enq(1, "k", true, 0, 1), gone(1)}},
		// 1 cancelled, 2 takes the key, then a Retry of 1 is acked while 2
		// lives: the Retry should have been refused.
		{"a Retry while another holds the key", "overlap", []Op{enq(1, "k", false, 0, 1),
			{F: "cancel", Type: "ok", Task: 1, Call: 2 * s, Return: 3 * s}, enq(2, "k", false, 4, 5),
			{F: "retry", Type: "ok", Task: 1, Key: "k", Call: 6 * s, Return: 7 * s}, fin(1, "k", "READY"), fin(2, "k", "COMPLETED")}},
	} {
		v := Unique(c.ops)
		if v.Valid || v.Counts[c.count] == 0 {
			t.Errorf("%s: %+v, want %s", c.name, v, c.count)
		}
	}
	// The holder's complete called before the second creation's answer
	// (it may have taken effect first): no overlap.
	ok := []Op{enq(1, "k", false, 0, 1), {F: "complete", Type: "info", Task: 1, Call: 2 * s, Return: -1}, enq(2, "k", false, 2, 3),
		fin(1, "k", "COMPLETED"), fin(2, "k", "READY")}
	if v := Unique(ok); !v.Valid {
		t.Fatalf("a complete under way: %+v", v)
	}
	// A Retry after the other holder was cancelled is a new life, legal.
	retried := []Op{enq(1, "k", false, 0, 1), {F: "cancel", Type: "ok", Task: 1, Call: 2 * s, Return: 3 * s},
		enq(2, "k", false, 4, 5), {F: "cancel", Type: "ok", Task: 2, Call: 6 * s, Return: 7 * s},
		{F: "retry", Type: "ok", Task: 1, Key: "k", Call: 8 * s, Return: 9 * s}, fin(1, "k", "READY"), fin(2, "k", "CANCELLED")}
	if v := Unique(retried); !v.Valid || v.Counts["retried"] != 1 {
		t.Fatalf("a Retry after the holder's cancel: %+v", v)
	}
	if v := Unique(nil); v.Skipped == "" {
		t.Fatalf("an empty history: %+v", v)
	}
}
