package dispatch

import (
	"testing"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
)

// TestTerminalSettles: a replica's terminal copy settles a call only under
// a claim its claim record knows, of a life the copy has seen end.
func TestTerminalSettles(t *testing.T) {
	cancelled := func(life uint32) *crdt.Task {
		return &crdt.Task{ID: 1, Terminals: []crdt.Terminal{{Kind: crdt.Cancelled, Life: life}}}
	}
	record := func(life uint32, tokens ...uint64) *claims.Record {
		r := &claims.Record{Life: life, Terminal: claims.EndCancelled}
		for _, tok := range tokens {
			r.History = append(r.History, claims.Claim{Token: tok, End: claims.EndCancelled})
		}
		return r
	}
	for _, c := range []struct {
		what  string
		ts    coord.TaskState
		claim uint64
		want  bool
	}{
		{"not terminal", coord.TaskState{Task: &crdt.Task{ID: 1}, Claims: record(0, 10)}, 10, false},
		{"a claim the record knows", coord.TaskState{Task: cancelled(0), Claims: record(0, 10)}, 10, true},
		{"an older claim", coord.TaskState{Task: cancelled(0), Claims: record(0, 5, 10)}, 7, true},
		{"a claim after the record's last (granted after a revival it missed)", coord.TaskState{Task: cancelled(0), Claims: record(0, 10)}, 91, false},
		{"no record", coord.TaskState{Task: cancelled(0)}, 10, false},
		{"a record a life ahead of the copy", coord.TaskState{Task: cancelled(0), Claims: record(1, 10, 91)}, 91, false},
		{"a copy a life ahead of the record", coord.TaskState{Task: cancelled(1), Claims: record(0, 10)}, 10, true},
	} {
		if got := TerminalSettles(&c.ts, c.claim); got != c.want {
			t.Errorf("%s: %v, want %v", c.what, got, c.want)
		}
	}
}
