package claims

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/norn-dev/norn/storage"
)

// uniqueFSM applies OpUnique commands to an in-memory table of records.
type uniqueFSM map[[2]string]*UniqueRecord

func (m uniqueFSM) apply(t *testing.T, nowMs int64, ops ...UniqueOp) []Outcome {
	t.Helper()
	cmd := &Command{Op: OpUnique, NowMs: nowMs, Uniques: ops}
	dec, err := DecodeCommand(cmd.Encode())
	if err != nil || !reflect.DeepEqual(dec, cmd) {
		t.Fatalf("command round trip: %+v, %v (want %+v)", dec, err, cmd)
	}
	outs, changes, err := ApplyUnique(dec, func(q, k string) (*UniqueRecord, error) { return m[[2]string{q, k}], nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range changes {
		if c.Record == nil {
			delete(m, [2]string{c.Queue, c.Key})
			continue
		}
		back, err := DecodeUniqueRecord(c.Record.Encode())
		if err != nil || *back != *c.Record {
			t.Fatalf("record round trip: %+v, %v", back, err)
		}
		m[[2]string{c.Queue, c.Key}] = c.Record
	}
	return outs
}

func holder(o Outcome) uint64 {
	if o.Unique == nil {
		return 0
	}
	return o.Unique.ID
}

func TestUniqueTakeAndHeld(t *testing.T) {
	m := uniqueFSM{}
	take := func(id uint64, key string) UniqueOp {
		return UniqueOp{Kind: UniqueTake, Queue: "q", Key: key, ID: id, Digest: id * 10}
	}
	o := m.apply(t, 1000, take(1, "k"), take(2, "k"), take(1, "k"), take(3, "other"))
	if o[0].Err != nil || holder(o[0]) != 1 || o[0].Unique.CreatedMs != 1000 {
		t.Fatalf("first take: %+v", o[0])
	}
	if !errors.Is(o[1].Err, ErrUniqueHeld) || holder(o[1]) != 1 || o[1].Unique.Digest != 10 {
		t.Fatalf("second take of one key in the same entry: %+v", o[1])
	}
	if o[2].Err != nil || holder(o[2]) != 1 {
		t.Fatalf("a take by the holder again (a retried enqueue): %+v", o[2])
	}
	if o[3].Err != nil || holder(o[3]) != 3 {
		t.Fatalf("another key: %+v", o[3])
	}
	// Keys are per queue.
	if o := m.apply(t, 1001, UniqueOp{Kind: UniqueTake, Queue: "q2", Key: "k", ID: 4}); o[0].Err != nil {
		t.Fatalf("the same key in another queue: %+v", o[0])
	}
}

func TestUniqueReplace(t *testing.T) {
	m := uniqueFSM{}
	m.apply(t, 1000, UniqueOp{Kind: UniqueTake, Queue: "q", Key: "k", ID: 1, WindowMs: 500})
	replace := func(now int64, id, holder uint64, life uint32) Outcome {
		return m.apply(t, now, UniqueOp{Kind: UniqueReplace, Queue: "q", Key: "k", ID: id, Holder: holder, HolderLife: life})[0]
	}
	if o := replace(1499, 2, 1, 0); !errors.Is(o.Err, ErrUniqueHeld) {
		t.Fatalf("replace within the window: %+v", o)
	}
	if o := replace(1500, 2, 9, 0); !errors.Is(o.Err, ErrUniqueHeld) || holder(o) != 1 {
		t.Fatalf("replace of a holder that is not the record's: %+v", o)
	}
	// A Retry of 1 to life 1 takes the key back before its revival: a
	// replace that saw life 0 finished is too late.
	if o := m.apply(t, 1500, UniqueOp{Kind: UniqueReacquire, Queue: "q", Key: "k", ID: 1, Life: 1}); o[0].Err != nil || o[0].Unique.Life != 1 || o[0].Unique.CreatedMs != 1500 {
		t.Fatalf("reacquire: %+v", o[0])
	}
	if o := replace(5000, 2, 1, 0); !errors.Is(o.Err, ErrUniqueHeld) {
		t.Fatalf("replace that saw an earlier life finished: %+v", o)
	}
	if o := replace(5000, 2, 1, 1); o.Err != nil || holder(o) != 2 || o.Unique.Life != 0 {
		t.Fatalf("replace of a finished holder: %+v", o)
	}
	if o := replace(5001, 2, 1, 1); o.Err != nil || holder(o) != 2 {
		t.Fatalf("the same replace again (a retry): %+v", o)
	}
	// The old holder's Retry is refused now.
	if o := m.apply(t, 5002, UniqueOp{Kind: UniqueReacquire, Queue: "q", Key: "k", ID: 1, Life: 2}); !errors.Is(o[0].Err, ErrUniqueHeld) || holder(o[0]) != 2 {
		t.Fatalf("reacquire of a key another task took: %+v", o[0])
	}
	// A replace of a key with no record takes it.
	if o := m.apply(t, 6000, UniqueOp{Kind: UniqueReplace, Queue: "q", Key: "none", ID: 3, Holder: 7}); o[0].Err != nil || holder(o[0]) != 3 {
		t.Fatalf("replace of a free key: %+v", o[0])
	}
}

func TestUniqueForget(t *testing.T) {
	m := uniqueFSM{}
	m.apply(t, 1000, UniqueOp{Kind: UniqueTake, Queue: "q", Key: "k", ID: 1})
	m.apply(t, 1001, UniqueOp{Kind: UniqueReacquire, Queue: "q", Key: "k", ID: 1, Life: 2})
	if o := m.apply(t, 2000, UniqueOp{Kind: UniqueForget, Queue: "q", Key: "k", Holder: 1, HolderLife: 1}); !errors.Is(o[0].Err, ErrUniqueHeld) || len(m) != 1 {
		t.Fatalf("forget of an earlier life: %+v", o[0])
	}
	if o := m.apply(t, 2000, UniqueOp{Kind: UniqueForget, Queue: "q", Key: "k", Holder: 2, HolderLife: 5}); !errors.Is(o[0].Err, ErrUniqueHeld) || len(m) != 1 {
		t.Fatalf("forget naming another holder: %+v", o[0])
	}
	if o := m.apply(t, 2000, UniqueOp{Kind: UniqueForget, Queue: "q", Key: "k", Holder: 1, HolderLife: 2}); o[0].Err != nil || o[0].Unique != nil || len(m) != 0 {
		t.Fatalf("forget: %+v, %d records", o[0], len(m))
	}
	if o := m.apply(t, 2001, UniqueOp{Kind: UniqueForget, Queue: "q", Key: "k", Holder: 1, HolderLife: 2}); o[0].Err != nil {
		t.Fatalf("forget of a key with no record: %+v", o[0])
	}
}

func TestUniqueBadOps(t *testing.T) {
	for _, ops := range [][]UniqueOp{
		nil,
		{{Kind: 0, Queue: "q", Key: "k", ID: 1}},
		{{Kind: 5, Queue: "q", Key: "k", ID: 1}},
		{{Kind: UniqueTake, Key: "k", ID: 1}},
		{{Kind: UniqueTake, Queue: "q", ID: 1}},
		{{Kind: UniqueTake, Queue: "q", Key: "k"}},
		{{Kind: UniqueTake, Queue: "q", Key: "k", ID: 1, WindowMs: -1}},
	} {
		outs, changes, err := ApplyUnique(&Command{Op: OpUnique, Uniques: ops}, nil)
		if err != nil || len(changes) != 0 || len(outs) != 1 || !errors.Is(outs[0].Err, ErrBadCommand) {
			t.Errorf("%+v: %+v, %v, %v", ops, outs, changes, err)
		}
	}
	if outs, _, _ := Apply(1, &Command{Op: OpUnique, Uniques: []UniqueOp{{Kind: UniqueTake, Queue: "q", Key: "k", ID: 1}}}, nil); !errors.Is(outs[0].Err, ErrBadCommand) {
		t.Fatalf("Apply of an OpUnique: %+v", outs)
	}
	if _, err := DecodeUniqueRecord([]byte{2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}); err == nil {
		t.Fatal("a record of an unknown version decoded")
	}
}

// Through a real group on Pebble: keys are decided by Raft entries, and a
// snapshot carries them to a fresh replica.
func TestGroupUniqueKeysSnapshot(t *testing.T) {
	dir := t.TempDir()
	n := startTestNode(t, dir, 8)
	now := time.Now().UnixMilli()
	for i := range 20 {
		o := n.propose(t, Command{Op: OpUnique, NowMs: now, Uniques: []UniqueOp{
			{Kind: UniqueTake, Queue: "q", Key: "k" + string(rune('a'+i)), ID: uint64(i + 1), WindowMs: int64(i)},
			{Kind: UniqueTake, Queue: "q", Key: "shared", ID: uint64(i + 1)},
		}})
		if o[0].Err != nil || (i == 0) != (o[1].Err == nil) || holder(o[1]) != 1 {
			t.Fatalf("entry %d: %+v", i, o)
		}
	}
	fresh := restoreSnapshot(t, n, dir, func(*storage.Store) {})
	_, want, _ := n.store.ClaimFSMDigest(3)
	_, got, _ := fresh.ClaimFSMDigest(3)
	if got != want {
		t.Fatal("the restored FSM's digest differs")
	}
	b, err := fresh.ClaimFSMUnique(3, "q", "shared")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := DecodeUniqueRecord(b); err != nil || r.ID != 1 {
		t.Fatalf("restored shared key: %+v, %v", r, err)
	}
	n.stop(t)
}

func TestUniqueRecordFree(t *testing.T) {
	r := &UniqueRecord{ID: 1, Life: 1, CreatedMs: 1000, WindowMs: 500}
	for _, c := range []struct {
		now      int64
		h        Holder
		life     uint32
		free     bool
		whatever string
	}{
		{1499, Holder{Found: true, Life: 1, Finished: true}, 0, false, "within the window"},
		{1500, Holder{Found: true, Life: 1, Finished: true}, 1, true, "finished past the window"},
		{1500, Holder{Found: true, Life: 2, Finished: true}, 2, true, "finished in a later life"},
		{1500, Holder{Found: true, Life: 1}, 0, false, "not finished"},
		{1500, Holder{Found: true, Life: 0, Finished: true}, 0, false, "finished in an earlier life than the record's (revival under way)"},
		{1500, Holder{}, 0, false, "gone, younger than the phantom limit"},
		{11000, Holder{}, 1, true, "gone past the phantom limit"},
	} {
		life, free := r.Free(c.now, c.h, 10_000)
		if life != c.life || free != c.free {
			t.Errorf("%s: %d, %v; want %d, %v", c.whatever, life, free, c.life, c.free)
		}
	}
}
