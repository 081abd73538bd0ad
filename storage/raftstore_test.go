package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

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

// TestRaftStoreAfterClose: hashicorp/raft reads FirstIndex and LastIndex from
// a goroutine that Raft.Shutdown does not wait for, so a RaftStore may be
// called while and after its Store closes. Each call either works or answers
// ErrClosed; none reaches the closed Pebble (which panics).
func TestRaftStoreAfterClose(t *testing.T) {
	s, _ := memStore(t)
	rs := s.RaftStore(7)
	mustRaft(t, rs.StoreLogs(raftTestLogs(1, 5)))

	stop := make(chan struct{})
	done := make(chan error)
	go func() {
		for {
			if _, err := rs.FirstIndex(); err != nil {
				done <- err
				return
			}
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
		}
	}()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	close(stop)
	if err := <-done; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("FirstIndex during Close: %v, want nil or ErrClosed", err)
	}

	var l raft.Log
	calls := map[string]error{
		"FirstIndex":  func() error { _, err := rs.FirstIndex(); return err }(),
		"LastIndex":   func() error { _, err := rs.LastIndex(); return err }(),
		"GetLog":      rs.GetLog(1, &l),
		"StoreLogs":   rs.StoreLogs(raftTestLogs(6, 6)),
		"DeleteRange": rs.DeleteRange(1, 2),
		"Set":         rs.Set([]byte("k"), []byte("v")),
		"Get":         func() error { _, err := rs.Get([]byte("k")); return err }(),
		"GetUint64":   func() error { _, err := rs.GetUint64([]byte("k")); return err }(),
		"SetUint64":   rs.SetUint64([]byte("k"), 1),
	}
	for name, err := range calls {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}
