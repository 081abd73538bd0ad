package crdt

import (
	"errors"
	"reflect"
	"testing"
)

// A revival begins a new life: the events of earlier lives no longer
// decide the status; the first event of the current life does, even one
// that arrived before its revival; the join of replicas that saw the
// events in any order agrees.
func TestLivesDecideTheStatus(t *testing.T) {
	dead := Terminal{At: Timestamp{WallMs: 10}, Kind: Dead, Claim: 4}
	revive := Revival{Life: 1, At: Timestamp{WallMs: 20}}
	done := Terminal{At: Timestamp{WallMs: 30}, Kind: Completed, Claim: 9, Life: 1}
	x := &Task{ID: 1, Terminals: []Terminal{dead}}
	if ev, ok := x.Terminal(); !ok || ev.Kind != Dead || x.Life() != 0 {
		t.Fatalf("life 0: %+v %v", ev, ok)
	}
	y, _ := mustJoin(t, x, &Task{ID: 1, Revivals: []Revival{revive}})
	if _, ok := y.Terminal(); ok || y.Life() != 1 {
		t.Fatalf("revived: terminal %v, life %d", ok, y.Life())
	}
	z, _ := mustJoin(t, y, &Task{ID: 1, Terminals: []Terminal{done}})
	if ev, ok := z.Terminal(); !ok || ev.Kind != Completed || ev.Life != 1 {
		t.Fatalf("life 1 completed: %+v %v", ev, ok)
	}
	// The completion of life 1 arrives before the revival: it counts.
	early, _ := mustJoin(t, x, &Task{ID: 1, Terminals: []Terminal{done}})
	if ev, ok := early.Terminal(); !ok || ev.Kind != Completed || early.Life() != 1 {
		t.Fatalf("an event of life 1 before its revival: %+v %v", ev, ok)
	}
	all, _ := mustJoin(t, early, &Task{ID: 1, Revivals: []Revival{revive}})
	if !reflect.DeepEqual(all, z) {
		t.Fatalf("the order of arrival changed the state:\n%+v\n%+v", all, z)
	}
	// An earlier life's event cannot end a later life, however early its
	// time: an abort of life 0 stamped before everything.
	stale := Terminal{At: Timestamp{WallMs: 1}, Kind: Aborted, Claim: 2, Errors: []TaskError{{Code: "old"}}}
	w, _ := mustJoin(t, y, &Task{ID: 1, Terminals: []Terminal{stale}})
	if _, ok := w.Terminal(); ok {
		t.Fatalf("a life 0 event ended life 1: %+v", w)
	}
	if got, err := Decode(z.Encode()); err != nil || !reflect.DeepEqual(got, z) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	h, err := DecodeHead(z.Encode())
	if err != nil || len(h.Terminals) != 1 || h.Terminals[0].Kind != Completed || h.Terminals[0].Life != 1 {
		t.Fatalf("DecodeHead of a task with lives: %+v, %v", h, err)
	}
	if h, err := DecodeHead(y.Encode()); err != nil || len(h.Terminals) != 0 {
		t.Fatalf("DecodeHead of a revived task: %+v, %v", h, err)
	}
}

func TestDecodeRejectsNonCanonicalLives(t *testing.T) {
	plain := (&Task{ID: 1}).Encode() // version, id, flags, 0 updates, 0 terminals
	livesFlag := append([]byte(nil), plain...)
	livesFlag[2] = flagLives
	tests := []struct {
		name string
		b    []byte
	}{
		{"the lives flag without a life", append(livesFlag, 0)},
		{"revival of life 0", (&Task{ID: 1, Revivals: []Revival{{Life: 0}}}).Encode()},
		{"revivals unsorted", (&Task{ID: 1, Revivals: []Revival{{Life: 2}, {Life: 1}}}).Encode()},
		{"revivals repeated", (&Task{ID: 1, Revivals: []Revival{{Life: 1}, {Life: 1}}}).Encode()},
	}
	for _, tc := range tests {
		if _, err := Decode(tc.b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", tc.name, err)
		}
	}
	var fe *FieldError
	if err := (&Task{ID: 1, Revivals: []Revival{{Life: 0}}}).Validate(DefaultLimits); !errors.As(err, &fe) || fe.Field != "revivals[0].life" {
		t.Errorf("revival of life 0: %v", err)
	}
}

// An event of a later life between two of life 0 (by time) still makes
// its life the current one.
func TestLifeOfAMiddleEvent(t *testing.T) {
	x := &Task{ID: 1, Terminals: []Terminal{
		{At: Timestamp{WallMs: 1}, Kind: Cancelled},
		{At: Timestamp{WallMs: 2}, Kind: Aborted, Claim: 5, Life: 1},
		{At: Timestamp{WallMs: 3}, Kind: Cancelled},
	}}
	x.Normalize()
	if ev, ok := x.Terminal(); !ok || ev.Life != 1 || ev.Kind != Aborted {
		t.Fatalf("terminal %+v %v, want the abort of life 1", ev, ok)
	}
}
