package storage

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// raftStoreUnderTest is what the conformance suite needs from a store.
type raftStoreUnderTest interface {
	raft.LogStore
	raft.StableStore
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
