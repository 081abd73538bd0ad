package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// raftStoreUnderTest is what the conformance suite needs from a store.
type raftStoreUnderTest interface {
	raft.LogStore
	raft.StableStore
}

// openRaftTestDB opens a Pebble DB in dir on fs. The caller closes it.
func openRaftTestDB(t testing.TB, fs vfs.FS, dir string) *pebble.DB {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{FS: fs, Logger: quietLogger{}})
	if err != nil {
		t.Fatalf("pebble.Open(%q): %v", dir, err)
	}
	return db
}

func openRaftTestDBCleanup(t testing.TB, fs vfs.FS, dir string) *pebble.DB {
	t.Helper()
	db := openRaftTestDB(t, fs, dir)
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close db: %v", err)
		}
	})
	return db
}

// raftTestLog returns a log entry whose every field depends on i.
func raftTestLog(i uint64) *raft.Log {
	return &raft.Log{
		Index:      i,
		Term:       i/4 + 1,
		Type:       raft.LogType(i % 6),
		Data:       []byte(fmt.Sprintf("data-%d", i)),
		Extensions: []byte(fmt.Sprintf("ext-%d", i)),
		AppendedAt: time.Unix(1_700_000_000, int64(i)*1_000_003).UTC(),
	}
}

func raftTestLogs(lo, hi uint64) []*raft.Log {
	var logs []*raft.Log
	for i := lo; i <= hi; i++ {
		logs = append(logs, raftTestLog(i))
	}
	return logs
}

// checkRaftLogEqual compares every field, treating nil and empty slices as
// equal and comparing AppendedAt as an instant.
func checkRaftLogEqual(t *testing.T, got, want *raft.Log) {
	t.Helper()
	if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
		!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) ||
		!got.AppendedAt.Equal(want.AppendedAt) || got.AppendedAt.IsZero() != want.AppendedAt.IsZero() {
		t.Errorf("log mismatch:\n got  %+v\n want %+v", *got, *want)
	}
}

func checkRaftIndexes(t *testing.T, s raft.LogStore, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil || f != first {
		t.Errorf("FirstIndex() = %d, %v; want %d, nil", f, err, first)
	}
	l, err := s.LastIndex()
	if err != nil || l != last {
		t.Errorf("LastIndex() = %d, %v; want %d, nil", l, err, last)
	}
}

// checkRaftLogsPresent checks that exactly the indexes in [lo, hi] that
// present reports true for are stored, with the contents raftTestLog gives.
func checkRaftLogsPresent(t *testing.T, s raft.LogStore, lo, hi uint64, present func(uint64) bool) {
	t.Helper()
	for i := lo; i <= hi; i++ {
		var got raft.Log
		err := s.GetLog(i, &got)
		switch {
		case present(i) && err != nil:
			t.Errorf("GetLog(%d) = %v, want the entry", i, err)
		case present(i):
			checkRaftLogEqual(t, &got, raftTestLog(i))
		case !errors.Is(err, raft.ErrLogNotFound):
			t.Errorf("GetLog(%d) = %v, want raft.ErrLogNotFound", i, err)
		}
	}
}

func mustRaft(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// testRaftStoreConformance checks the behaviour hashicorp/raft relies on.
// It holds for raft.InmemStore (the reference) and for RaftStore. Ranges stay
// small: InmemStore.DeleteRange loops over every index in [min, max] (and
// never ends for max == math.MaxUint64) and mishandles min == 0, which raft
// never passes; such ranges are tested on RaftStore alone.
func testRaftStoreConformance(t *testing.T, newStore func(t *testing.T) raftStoreUnderTest) {
	t.Run("Empty", func(t *testing.T) {
		s := newStore(t)
		checkRaftIndexes(t, s, 0, 0)
		var l raft.Log
		if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Errorf("GetLog(1) = %v, want raft.ErrLogNotFound", err)
		}
		if v, err := s.Get([]byte("CurrentTerm")); err == nil || err.Error() != "not found" || v != nil {
			t.Errorf(`Get(missing) = %q, %v; want nil, "not found"`, v, err)
		}
		// raft accepts either a nil error or "not found" with 0 here:
		// InmemStore gives nil, raft-boltdb and RaftStore "not found".
		if v, err := s.GetUint64([]byte("CurrentTerm")); v != 0 || (err != nil && err.Error() != "not found") {
			t.Errorf(`GetUint64(missing) = %d, %v; want 0 and nil or "not found"`, v, err)
		}
		// Deleting from an empty log is fine.
		mustRaft(t, s.DeleteRange(1, 10))
		checkRaftIndexes(t, s, 0, 0)
	})

	t.Run("LogRoundtrip", func(t *testing.T) {
		s := newStore(t)
		one := &raft.Log{
			Index: 1, Term: 3, Type: raft.LogConfiguration,
			Data: []byte("config"), Extensions: []byte{0, 1, 2, 0xff},
			AppendedAt: time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC),
		}
		mustRaft(t, s.StoreLog(one))
		var got raft.Log
		mustRaft(t, s.GetLog(1, &got))
		checkRaftLogEqual(t, &got, one)

		mustRaft(t, s.StoreLogs(raftTestLogs(2, 40)))
		checkRaftLogsPresent(t, s, 2, 41, func(i uint64) bool { return i <= 40 })
		checkRaftIndexes(t, s, 1, 40)

		// Overwriting an index (a follower replacing a conflicting suffix).
		repl := raftTestLog(40)
		repl.Term, repl.Data = 99, []byte("replacement")
		mustRaft(t, s.StoreLogs([]*raft.Log{repl}))
		mustRaft(t, s.GetLog(40, &got))
		checkRaftLogEqual(t, &got, repl)
		checkRaftIndexes(t, s, 1, 40)

		// Storing nothing changes nothing.
		mustRaft(t, s.StoreLogs(nil))
		checkRaftIndexes(t, s, 1, 40)
	})

	t.Run("AppendsMoveLastIndex", func(t *testing.T) {
		s := newStore(t)
		for i := uint64(5); i <= 9; i++ {
			mustRaft(t, s.StoreLog(raftTestLog(i)))
			checkRaftIndexes(t, s, 5, i)
		}
		mustRaft(t, s.StoreLogs(raftTestLogs(10, 300)))
		checkRaftIndexes(t, s, 5, 300)
	})

	deleteCases := []struct {
		name        string
		min, max    uint64
		first, last uint64
	}{
		{"Prefix", 1, 5, 6, 20},
		{"PrefixFromZero", 0, 5, 6, 20},
		{"Suffix", 16, 20, 1, 15},
		{"SuffixPastEnd", 16, 100, 1, 15},
		{"Middle", 9, 11, 1, 20},
		{"Single", 7, 7, 1, 20},
		{"FirstOnly", 1, 1, 2, 20},
		{"LastOnly", 20, 20, 1, 19},
		{"All", 1, 20, 0, 0},
		{"AllWider", 1, 100, 0, 0},
	}
	for _, tc := range deleteCases {
		t.Run("DeleteRange"+tc.name, func(t *testing.T) {
			s := newStore(t)
			mustRaft(t, s.StoreLogs(raftTestLogs(1, 20)))
			mustRaft(t, s.DeleteRange(tc.min, tc.max))
			checkRaftIndexes(t, s, tc.first, tc.last)
			checkRaftLogsPresent(t, s, 0, 22, func(i uint64) bool {
				return i >= 1 && i <= 20 && (i < tc.min || i > tc.max)
			})
		})
	}

	t.Run("DeleteRangeThenAppend", func(t *testing.T) {
		s := newStore(t)
		mustRaft(t, s.StoreLogs(raftTestLogs(1, 20)))
		mustRaft(t, s.DeleteRange(1, 10))  // compaction
		mustRaft(t, s.DeleteRange(15, 20)) // conflict truncation
		mustRaft(t, s.StoreLogs(raftTestLogs(15, 25)))
		checkRaftIndexes(t, s, 11, 25)
		checkRaftLogsPresent(t, s, 0, 26, func(i uint64) bool { return i >= 11 && i <= 25 })
	})

	t.Run("Stable", func(t *testing.T) {
		s := newStore(t)
		mustRaft(t, s.Set([]byte("LastVoteCand"), []byte("node-1")))
		mustRaft(t, s.Set([]byte("LastVoteCandX"), []byte("other")))
		if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-1" {
			t.Errorf("Get = %q, %v; want node-1", v, err)
		}
		mustRaft(t, s.Set([]byte("LastVoteCand"), []byte("node-22")))
		if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-22" {
			t.Errorf("Get after overwrite = %q, %v; want node-22", v, err)
		}
		if v, err := s.Get([]byte("LastVoteCandX")); err != nil || string(v) != "other" {
			t.Errorf("Get(other key) = %q, %v; want other", v, err)
		}
		if v, err := s.Get([]byte("LastVote")); err == nil || err.Error() != "not found" {
			t.Errorf(`Get(prefix of a key) = %q, %v; want "not found"`, v, err)
		}

		for _, want := range []uint64{1, 0, math.MaxUint64, 7} {
			mustRaft(t, s.SetUint64([]byte("CurrentTerm"), want))
			if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != want {
				t.Errorf("GetUint64 = %d, %v; want %d", v, err, want)
			}
		}

		// An empty value is a value: found, and empty.
		mustRaft(t, s.Set([]byte("empty"), []byte{}))
		if v, err := s.Get([]byte("empty")); err != nil || len(v) != 0 {
			t.Errorf("Get(empty) = %q, %v; want empty, nil", v, err)
		}

		// Logs and stable keys do not mix.
		mustRaft(t, s.StoreLogs(raftTestLogs(1, 3)))
		mustRaft(t, s.DeleteRange(1, 100))
		if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
			t.Errorf("GetUint64 after DeleteRange = %d, %v; want 7", v, err)
		}
	})
}

func TestRaftStoreConformance(t *testing.T) {
	t.Run("InmemStore", func(t *testing.T) {
		testRaftStoreConformance(t, func(t *testing.T) raftStoreUnderTest { return raft.NewInmemStore() })
	})
	t.Run("PebbleMem", func(t *testing.T) {
		testRaftStoreConformance(t, func(t *testing.T) raftStoreUnderTest {
			return NewRaftStore(openRaftTestDBCleanup(t, vfs.NewMem(), ""), 1)
		})
	})
	t.Run("PebbleDisk", func(t *testing.T) {
		testRaftStoreConformance(t, func(t *testing.T) raftStoreUnderTest {
			return NewRaftStore(openRaftTestDBCleanup(t, vfs.Default, t.TempDir()), 1)
		})
	})
	// The store under test sits between busy neighbours: partitions 4 and 6
	// have logs and stable keys, and partition 5 has keys with other tags.
	t.Run("PebbleMemNeighbours", func(t *testing.T) {
		testRaftStoreConformance(t, func(t *testing.T) raftStoreUnderTest {
			db := openRaftTestDBCleanup(t, vfs.NewMem(), "")
			for _, p := range []uint16{4, 6} {
				n := NewRaftStore(db, p)
				mustRaft(t, n.StoreLogs(raftTestLogs(1, 50)))
				mustRaft(t, n.SetUint64([]byte("CurrentTerm"), 3))
				mustRaft(t, n.Set([]byte("LastVoteCand"), []byte("x")))
			}
			for _, tag := range []byte{0x01, 0x05, 0x0f, 0x12, 0xff} {
				key := append(partitionPrefix(5, tag), 0, 0, 0, 0, 0, 0, 0, 9)
				mustRaft(t, db.Set(key, []byte("foreign"), pebble.Sync))
			}
			return NewRaftStore(db, 5)
		})
	})
}

// TestRaftStoreNotFound pins the exact not-found errors raft depends on.
func TestRaftStoreNotFound(t *testing.T) {
	s := NewRaftStore(openRaftTestDBCleanup(t, vfs.NewMem(), ""), 1)
	var l raft.Log
	if err := s.GetLog(3, &l); err != raft.ErrLogNotFound {
		t.Errorf("GetLog(missing) = %v, want raft.ErrLogNotFound itself", err)
	}
	v, err := s.Get([]byte("k"))
	if v != nil || err != ErrStableKeyNotFound || err.Error() != "not found" {
		t.Errorf(`Get(missing) = %q, %v; want nil, ErrStableKeyNotFound ("not found")`, v, err)
	}
	u, err := s.GetUint64([]byte("k"))
	if u != 0 || err != ErrStableKeyNotFound || err.Error() != "not found" {
		t.Errorf(`GetUint64(missing) = %d, %v; want 0, ErrStableKeyNotFound ("not found")`, u, err)
	}
}

// TestRaftStorePreservesLogs checks that RaftStore keeps every field of a
// log exactly, edge values included.
func TestRaftStorePreservesLogs(t *testing.T) {
	s := NewRaftStore(openRaftTestDBCleanup(t, vfs.NewMem(), ""), 1)
	big := bytes.Repeat([]byte{0xab}, 1<<20)
	local := time.FixedZone("X", 3600)
	cases := []*raft.Log{
		{Index: 1},
		{Index: 2, Term: 1, Type: raft.LogNoop, AppendedAt: time.Now()},
		{Index: 3, Term: math.MaxUint64, Type: raft.LogType(255), Data: big, Extensions: big[:77]},
		{Index: 4, Data: []byte{}, Extensions: []byte{}},
		{Index: 5, Data: []byte{0}, Extensions: []byte{0}},
		{Index: 6, AppendedAt: time.Date(2262, 4, 11, 23, 47, 16, 854775807, time.UTC)},
		{Index: 7, AppendedAt: time.Date(1677, 9, 21, 0, 12, 43, 145224192, time.UTC)},
		{Index: 8, AppendedAt: time.Unix(0, 1)},
		{Index: 9, AppendedAt: time.Date(2025, 1, 2, 3, 4, 5, 6, local)},
		{Index: math.MaxUint64, Type: raft.LogBarrier, Data: []byte("last")},
	}
	mustRaft(t, s.StoreLogs(cases))
	for _, want := range cases {
		var got raft.Log
		mustRaft(t, s.GetLog(want.Index, &got))
		checkRaftLogEqual(t, &got, want)
	}
	checkRaftIndexes(t, s, 1, math.MaxUint64)

	// Times that Unix nanoseconds cannot hold are clamped, not garbled.
	far := []struct{ in, want time.Time }{
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MaxInt64)},
		{time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MinInt64)},
	}
	for i, c := range far {
		idx := uint64(100 + i)
		mustRaft(t, s.StoreLog(&raft.Log{Index: idx, AppendedAt: c.in}))
		var got raft.Log
		mustRaft(t, s.GetLog(idx, &got))
		if !got.AppendedAt.Equal(c.want) {
			t.Errorf("AppendedAt %v read back as %v, want %v", c.in, got.AppendedAt, c.want)
		}
	}
}

// TestRaftStoreDeleteRangeEdges covers bounds InmemStore cannot run.
func TestRaftStoreDeleteRangeEdges(t *testing.T) {
	s := NewRaftStore(openRaftTestDBCleanup(t, vfs.NewMem(), ""), 0xffff)
	logs := append(raftTestLogs(1, 5), raftTestLog(math.MaxUint64-1), raftTestLog(math.MaxUint64))
	mustRaft(t, s.StoreLogs(logs))
	checkRaftIndexes(t, s, 1, math.MaxUint64)
	mustRaft(t, s.DeleteRange(math.MaxUint64, math.MaxUint64))
	checkRaftIndexes(t, s, 1, math.MaxUint64-1)
	mustRaft(t, s.DeleteRange(6, math.MaxUint64))
	checkRaftIndexes(t, s, 1, 5)
	mustRaft(t, s.DeleteRange(5, 4)) // min > max: nothing
	mustRaft(t, s.DeleteRange(0, 0))
	checkRaftIndexes(t, s, 1, 5)
	checkRaftLogsPresent(t, s, 0, 6, func(i uint64) bool { return i >= 1 && i <= 5 })
	mustRaft(t, s.DeleteRange(0, math.MaxUint64))
	checkRaftIndexes(t, s, 0, 0)
}

// TestRaftStoreOwnership checks that slices passed in and handed out are not
// shared with the store.
func TestRaftStoreOwnership(t *testing.T) {
	s := NewRaftStore(openRaftTestDBCleanup(t, vfs.NewMem(), ""), 1)
	in := &raft.Log{Index: 1, Data: []byte("data"), Extensions: []byte("ext")}
	mustRaft(t, s.StoreLog(in))
	in.Data[0] = 'X'

	var a raft.Log
	mustRaft(t, s.GetLog(1, &a))
	if string(a.Data) != "data" {
		t.Fatalf("stored data changed with the caller's slice: %q", a.Data)
	}
	a.Data[0] = 'Y'
	_ = append(a.Data, "clobber"...) // must not overwrite Extensions
	if string(a.Extensions) != "ext" {
		t.Errorf("appending to Data changed Extensions: %q", a.Extensions)
	}
	var b raft.Log
	mustRaft(t, s.GetLog(1, &b))
	if string(b.Data) != "data" {
		t.Errorf("GetLog result aliases the store: %q", b.Data)
	}

	val := []byte("value")
	mustRaft(t, s.Set([]byte("k"), val))
	val[0] = 'X'
	v1, err := s.Get([]byte("k"))
	mustRaft(t, err)
	v1[0] = 'Y'
	v2, err := s.Get([]byte("k"))
	mustRaft(t, err)
	if string(v2) != "value" {
		t.Errorf("Get = %q, want value", v2)
	}

	// nil is stored as an empty value (InmemStore would report "not found").
	mustRaft(t, s.Set([]byte("nil"), nil))
	if v, err := s.Get([]byte("nil")); err != nil || v == nil || len(v) != 0 {
		t.Errorf("Get(set to nil) = %#v, %v; want []byte{}, nil", v, err)
	}
}

// TestRaftStorePartitionIsolation checks that two partitions' stores on one
// DB never see each other's data nor keys with other tags.
func TestRaftStorePartitionIsolation(t *testing.T) {
	db := openRaftTestDBCleanup(t, vfs.NewMem(), "")
	s1, s2 := NewRaftStore(db, 1), NewRaftStore(db, 2)

	// Keys of other owners, around and inside partition 1's span.
	var foreign [][]byte
	for _, k := range []struct {
		p   uint16
		tag byte
	}{{1, 0x01}, {1, 0x05}, {1, 0x0f}, {1, 0x12}, {1, 0xff}, {0, 0x10}, {0, 0x11}, {0x100, 0x10}, {3, 0x10}} {
		key := binary.BigEndian.AppendUint64(partitionPrefix(k.p, k.tag), 12345)
		foreign = append(foreign, key)
		mustRaft(t, db.Set(key, []byte("foreign"), pebble.Sync))
	}
	checkForeign := func() {
		t.Helper()
		for _, key := range foreign {
			v, closer, err := db.Get(key)
			if err != nil {
				t.Errorf("foreign key %x: %v", key, err)
				continue
			}
			if string(v) != "foreign" {
				t.Errorf("foreign key %x = %q", key, v)
			}
			closer.Close()
		}
	}

	checkRaftIndexes(t, s1, 0, 0) // foreign keys are not logs
	mustRaft(t, s1.StoreLogs(raftTestLogs(1, 10)))
	mustRaft(t, s2.StoreLogs(raftTestLogs(5, 30)))
	mustRaft(t, s1.SetUint64([]byte("CurrentTerm"), 1))
	mustRaft(t, s2.SetUint64([]byte("CurrentTerm"), 2))
	mustRaft(t, s1.Set([]byte("only-1"), []byte("x")))

	checkRaftIndexes(t, s1, 1, 10)
	checkRaftIndexes(t, s2, 5, 30)
	checkRaftLogsPresent(t, s1, 0, 31, func(i uint64) bool { return i >= 1 && i <= 10 })
	if v, err := s1.GetUint64([]byte("CurrentTerm")); err != nil || v != 1 {
		t.Errorf("s1 CurrentTerm = %d, %v", v, err)
	}
	if v, err := s2.GetUint64([]byte("CurrentTerm")); err != nil || v != 2 {
		t.Errorf("s2 CurrentTerm = %d, %v", v, err)
	}
	if _, err := s2.Get([]byte("only-1")); err == nil || err.Error() != "not found" {
		t.Errorf("s2 sees s1's stable key: %v", err)
	}

	mustRaft(t, s1.DeleteRange(3, 4))
	mustRaft(t, s2.DeleteRange(0, 7))
	checkRaftLogsPresent(t, s1, 0, 31, func(i uint64) bool { return i >= 1 && i <= 10 && (i < 3 || i > 4) })
	checkRaftLogsPresent(t, s2, 0, 31, func(i uint64) bool { return i >= 8 && i <= 30 })

	mustRaft(t, s1.DeleteRange(0, math.MaxUint64))
	checkRaftIndexes(t, s1, 0, 0)
	checkRaftIndexes(t, s2, 8, 30)
	if v, err := s1.GetUint64([]byte("CurrentTerm")); err != nil || v != 1 {
		t.Errorf("s1 CurrentTerm after DeleteRange = %d, %v", v, err)
	}
	checkForeign()
}

// TestRaftStoreDurability crashes a Pebble on a crashable filesystem, losing
// a random half of whatever was not synced, and checks that every write
// RaftStore returned from survived.
func TestRaftStoreDurability(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			db := openRaftTestDB(t, fs, "db")
			s := NewRaftStore(db, 9)
			for lo := uint64(1); lo <= 200; lo += 50 {
				mustRaft(t, s.StoreLogs(raftTestLogs(lo, lo+49)))
			}
			mustRaft(t, s.StoreLog(raftTestLog(201)))
			mustRaft(t, s.DeleteRange(1, 20))
			mustRaft(t, s.DeleteRange(190, 195))
			mustRaft(t, s.SetUint64([]byte("CurrentTerm"), 42))
			mustRaft(t, s.Set([]byte("LastVoteCand"), []byte("node-3")))

			crashed := fs.CrashClone(vfs.CrashCloneCfg{
				UnsyncedDataPercent: 50,
				RNG:                 rand.New(rand.NewPCG(seed, seed)),
			})
			mustRaft(t, db.Close())

			db2 := openRaftTestDBCleanup(t, crashed, "db")
			s2 := NewRaftStore(db2, 9)
			checkRaftIndexes(t, s2, 21, 201)
			checkRaftLogsPresent(t, s2, 0, 202, func(i uint64) bool {
				return i >= 21 && i <= 201 && (i < 190 || i > 195)
			})
			if v, err := s2.GetUint64([]byte("CurrentTerm")); err != nil || v != 42 {
				t.Errorf("CurrentTerm = %d, %v; want 42", v, err)
			}
			if v, err := s2.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-3" {
				t.Errorf("LastVoteCand = %q, %v; want node-3", v, err)
			}
		})
	}
}

// TestRaftStoreCorrupt checks that undecodable values give ErrCorrupt naming
// the partition and key, never a panic.
func TestRaftStoreCorrupt(t *testing.T) {
	db := openRaftTestDBCleanup(t, vfs.NewMem(), "")
	s := NewRaftStore(db, 0x0102)
	valid := encodeRaftLog(nil, raftTestLog(7))
	withLen := func(off int, n uint32) []byte {
		b := bytes.Clone(valid)
		binary.BigEndian.PutUint32(b[off:], n)
		return b
	}
	cases := []struct {
		name  string
		value []byte
		want  string
	}{
		{"Empty", nil, "shorter than"},
		{"Garbage", []byte("garbage"), "shorter than"},
		{"Version0", append([]byte{0}, valid[1:]...), "unknown log format version 0"},
		{"Version2", append([]byte{2}, valid[1:]...), "unknown log format version 2"},
		{"UnknownFlags", func() []byte { b := bytes.Clone(valid); b[18] = 3; return b }(), "unknown log flags"},
		{"TimeWithoutFlag", func() []byte { b := bytes.Clone(valid); b[18] = 0; return b }(), "without its flag"},
		{"Truncated", valid[:len(valid)-1], "exceeds"},
		{"NoExtensionsLength", valid[:raftLogHeaderLen+4+len("data-7")+2], "truncated before extensions"},
		{"Trailing", append(bytes.Clone(valid), 0), "trailing"},
		{"HugeDataLength", withLen(raftLogHeaderLen, math.MaxUint32), "exceeds"},
		{"WrongIndex", encodeRaftLog(nil, raftTestLog(8)), "holds log index 8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := s.appendLogKey(nil, 7)
			mustRaft(t, db.Set(key, tc.value, pebble.Sync))
			var l raft.Log
			err := s.GetLog(7, &l)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("GetLog = %v, want ErrCorrupt", err)
			}
			for _, want := range []string{hex.EncodeToString(key), "partition 258", tc.want} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}

	// Keys of the wrong length at either end of the log span.
	low := append(partitionPrefix(0x0102, tagRaftLog), 0)
	high := append(partitionPrefix(0x0102, tagRaftLog), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0)
	mustRaft(t, db.Set(low, valid, pebble.Sync))
	mustRaft(t, db.Set(high, valid, pebble.Sync))
	if _, err := s.FirstIndex(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), hex.EncodeToString(low)) {
		t.Errorf("FirstIndex with a short key = %v, want ErrCorrupt naming %x", err, low)
	}
	if _, err := s.LastIndex(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), hex.EncodeToString(high)) {
		t.Errorf("LastIndex with a long key = %v, want ErrCorrupt naming %x", err, high)
	}

	// A stable uint64 that is not 8 bytes.
	mustRaft(t, s.Set([]byte("CurrentTerm"), []byte{1, 2, 3}))
	if _, err := s.GetUint64([]byte("CurrentTerm")); !errors.Is(err, ErrCorrupt) ||
		!strings.Contains(err.Error(), hex.EncodeToString(s.stableKey([]byte("CurrentTerm")))) {
		t.Errorf("GetUint64 of a 3-byte value = %v, want ErrCorrupt naming the key", err)
	}
}

func FuzzDecodeLog(f *testing.F) {
	seeds := []*raft.Log{
		{},
		{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: []byte("cfg"), AppendedAt: time.Unix(1_700_000_000, 5)},
		{Index: math.MaxUint64, Term: math.MaxUint64, Type: 255, Extensions: []byte{1, 2, 3}},
		{Index: 7, AppendedAt: time.Unix(0, math.MinInt64)},
		raftTestLog(12345),
	}
	for _, l := range seeds {
		f.Add(encodeRaftLog(nil, l))
	}
	f.Add([]byte{})
	f.Add([]byte{raftLogFormatV1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if err := decodeRaftLog(b, &l); err != nil {
			return
		}
		if re := encodeRaftLog(nil, &l); !bytes.Equal(re, b) {
			t.Fatalf("decoded %+v re-encodes as\n%x\nnot\n%x", l, re, b)
		}
	})
}

// raftStoreTestFSM counts applied commands.
type raftStoreTestFSM struct {
	mu      sync.Mutex
	applied [][]byte
}

func (f *raftStoreTestFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, bytes.Clone(l.Data))
	return len(f.applied)
}

func (f *raftStoreTestFSM) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.applied)
}

func (f *raftStoreTestFSM) Snapshot() (raft.FSMSnapshot, error) { return raftStoreTestSnapshot{}, nil }

func (f *raftStoreTestFSM) Restore(rc io.ReadCloser) error { return rc.Close() }

type raftStoreTestSnapshot struct{}

func (raftStoreTestSnapshot) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (raftStoreTestSnapshot) Release()                             {}

// waitRaftStore polls cond until it holds or the deadline passes.
func waitRaftStore(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestRaftStoreWithRaft runs a real single-voter Raft group on RaftStore,
// restarts it on the reopened DB, and checks that nothing applied is lost.
func TestRaftStoreWithRaft(t *testing.T) {
	dir := t.TempDir()
	const partition, entries = 7, 25
	conf := raft.DefaultConfig()
	conf.LocalID = "n1"
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft", Output: t.Output(), Level: hclog.Warn})
	snaps := raft.NewInmemSnapshotStore()

	// First life: bootstrap, elect, apply.
	db := openRaftTestDB(t, vfs.Default, dir)
	store := NewRaftStore(db, partition)
	addr, trans := raft.NewInmemTransport("")
	mustRaft(t, raft.BootstrapCluster(conf, store, store, snaps, trans, raft.Configuration{
		Servers: []raft.Server{{ID: conf.LocalID, Address: addr}},
	}))
	fsm := &raftStoreTestFSM{}
	r, err := raft.NewRaft(conf, fsm, store, store, snaps, trans)
	mustRaft(t, err)
	waitRaftStore(t, "leadership", func() bool { return r.State() == raft.Leader })
	var lastApplied uint64
	for i := range entries {
		f := r.Apply([]byte(fmt.Sprintf("cmd-%d", i)), time.Second)
		mustRaft(t, f.Error())
		lastApplied = f.Index()
	}
	if fsm.count() != entries {
		t.Fatalf("FSM applied %d entries, want %d", fsm.count(), entries)
	}
	mustRaft(t, r.Shutdown().Error())
	mustRaft(t, trans.Close())
	mustRaft(t, db.Close())

	// Second life: same directory, fresh DB handle, store, FSM and Raft.
	db = openRaftTestDBCleanup(t, vfs.Default, dir)
	store = NewRaftStore(db, partition)
	if last, err := store.LastIndex(); err != nil || last < lastApplied {
		t.Fatalf("LastIndex after reopen = %d, %v; want >= %d", last, err, lastApplied)
	}
	var l raft.Log
	mustRaft(t, store.GetLog(lastApplied, &l))
	if l.Type != raft.LogCommand || string(l.Data) != fmt.Sprintf("cmd-%d", entries-1) || l.AppendedAt.IsZero() {
		t.Errorf("last applied entry = %+v", l)
	}
	if term, err := store.GetUint64([]byte("CurrentTerm")); err != nil || term == 0 {
		t.Errorf("CurrentTerm after reopen = %d, %v", term, err)
	}

	_, trans = raft.NewInmemTransport(addr)
	defer trans.Close()
	fsm = &raftStoreTestFSM{}
	r, err = raft.NewRaft(conf, fsm, store, store, snaps, trans)
	mustRaft(t, err)
	defer func() { mustRaft(t, r.Shutdown().Error()) }()
	if r.LastIndex() < lastApplied {
		t.Fatalf("restarted raft LastIndex = %d, want >= %d", r.LastIndex(), lastApplied)
	}
	waitRaftStore(t, "re-election", func() bool { return r.State() == raft.Leader })
	mustRaft(t, r.Barrier(time.Second).Error())
	if fsm.count() != entries {
		t.Errorf("restarted FSM replayed %d entries, want %d", fsm.count(), entries)
	}
	f := r.Apply([]byte("after-restart"), time.Second)
	mustRaft(t, f.Error())
	if f.Index() <= lastApplied {
		t.Errorf("new entry index %d, want > %d", f.Index(), lastApplied)
	}
}

// BenchmarkStoreLogs measures one synced StoreLogs of 64 entries of 100
// bytes on a real disk.
func BenchmarkStoreLogs(b *testing.B) {
	db := openRaftTestDBCleanup(b, vfs.Default, b.TempDir())
	s := NewRaftStore(db, 1)
	const batch = 64
	logs := make([]*raft.Log, batch)
	data := bytes.Repeat([]byte{'x'}, 100)
	for i := range logs {
		logs[i] = &raft.Log{Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
	}
	b.ReportAllocs()
	b.SetBytes(batch * 100)
	next := uint64(1)
	for b.Loop() {
		for _, l := range logs {
			l.Index = next
			next++
		}
		if err := s.StoreLogs(logs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(next-1)/b.Elapsed().Seconds(), "entries/s")
}
