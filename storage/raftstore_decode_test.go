package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

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
