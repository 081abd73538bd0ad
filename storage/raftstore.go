package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
)

const (
	raftLogKeyLen = 2 + 1 + 8

	// raftLogFormatV1 is the first byte of every encoded raft.Log.
	raftLogFormatV1 byte = 1
	// raftLogFlagAppendedAt is set when Log.AppendedAt is not the zero time.
	raftLogFlagAppendedAt byte = 1 << 0
	// raftLogHeaderLen: version, index, term, type, flags, appendedAt.
	raftLogHeaderLen = 1 + 8 + 8 + 1 + 1 + 8
)

var (
	_ raft.LogStore    = (*RaftStore)(nil)
	_ raft.StableStore = (*RaftStore)(nil)
)

// RaftStore is a raft.LogStore and raft.StableStore for one partition's Raft
// group, kept in the node's shared Pebble DB so that every group writes to one
// WAL and concurrent groups share its group commit.
//
// Log entries live under (partition, 0x10, index) and stable keys under
// (partition, 0x11, key); RaftStore never reads or writes any other key.
// Every write is synced (pebble.Sync) before the method returns.
//
// RaftStore holds no mutable state: it is safe for concurrent use, and any
// number of RaftStores for the same partition see the same data. It does not
// own the DB. A RaftStore from Store.RaftStore answers errors wrapping
// ErrClosed after Store.Close (raft's metrics goroutine outlives
// Raft.Shutdown); one from NewRaftStore must not be used after the DB closes.
//
// Slices returned by Get and the Data and Extensions of a Log filled by
// GetLog are owned by the caller. Errors: GetLog returns raft.ErrLogNotFound
// for a missing index; Get and GetUint64 return ErrStableKeyNotFound for a
// missing key; a value that cannot be decoded gives an error wrapping
// ErrCorrupt; anything else is an error from Pebble.
type RaftStore struct {
	db        *pebble.DB
	guard     *closeGuard // nil from NewRaftStore
	partition uint16
	// logLower and logUpper bound the partition's log span: [p 0x10, p 0x11).
	logLower []byte
	logUpper []byte
}

// NewRaftStore returns the Raft log and stable store of partition in db.
// It does no I/O.
func NewRaftStore(db *pebble.DB, partition uint16) *RaftStore {
	return &RaftStore{
		db:        db,
		partition: partition,
		logLower:  partitionPrefix(partition, tagRaftLog),
		logUpper:  partitionPrefix(partition, tagRaftLog+1),
	}
}

// appendLogKey appends the key of log index i to dst.
func (s *RaftStore) appendLogKey(dst []byte, i uint64) []byte {
	dst = append(dst, s.logLower...)
	return binary.BigEndian.AppendUint64(dst, i)
}

func (s *RaftStore) stableKey(k []byte) []byte {
	return append(partitionPrefix(s.partition, tagRaftKV), k...)
}

// corrupt returns an error wrapping ErrCorrupt that names the key.
// enter guards one call into Pebble; see closeGuard.
func (s *RaftStore) enter() error {
	if err := s.guard.enter(); err != nil {
		return fmt.Errorf("storage: raft store partition %d: %w", s.partition, err)
	}
	return nil
}

func (s *RaftStore) corrupt(key []byte, detail error) error {
	return fmt.Errorf("%w: raft store partition %d key %x: %v", ErrCorrupt, s.partition, key, detail)
}

// FirstIndex returns the lowest log index stored, or 0 if there is none.
// It is one bounded seek, O(log n).
func (s *RaftStore) FirstIndex() (uint64, error) {
	return s.edgeIndex(false)
}

// LastIndex returns the highest log index stored, or 0 if there is none.
// It is one bounded seek, O(log n).
func (s *RaftStore) LastIndex() (uint64, error) {
	return s.edgeIndex(true)
}

func (s *RaftStore) edgeIndex(last bool) (idx uint64, err error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.guard.exit()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: s.logLower, UpperBound: s.logUpper})
	if err != nil {
		return 0, fmt.Errorf("storage: raft store partition %d: %w", s.partition, err)
	}
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			idx, err = 0, fmt.Errorf("storage: raft store partition %d: %w", s.partition, cerr)
		}
	}()
	var ok bool
	if last {
		ok = it.Last()
	} else {
		ok = it.First()
	}
	if !ok {
		if err := it.Error(); err != nil {
			return 0, fmt.Errorf("storage: raft store partition %d: %w", s.partition, err)
		}
		return 0, nil
	}
	key := it.Key()
	if len(key) != raftLogKeyLen {
		return 0, s.corrupt(key, fmt.Errorf("log key is %d bytes, want %d", len(key), raftLogKeyLen))
	}
	return binary.BigEndian.Uint64(key[3:]), nil
}

// GetLog fills log with the entry at index. It returns raft.ErrLogNotFound if
// there is none, and an error wrapping ErrCorrupt if the stored value does
// not decode or holds another index. log.Data and log.Extensions are fresh
// slices owned by the caller (nil when empty).
func (s *RaftStore) GetLog(index uint64, log *raft.Log) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.guard.exit()
	var kb [raftLogKeyLen]byte
	key := s.appendLogKey(kb[:0], index)
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("storage: raft store partition %d key %x: %w", s.partition, key, err)
	}
	// Copy once; Data and Extensions point into this copy, never into
	// Pebble's buffers.
	buf := append([]byte(nil), v...)
	if err := closer.Close(); err != nil {
		return fmt.Errorf("storage: raft store partition %d key %x: %w", s.partition, key, err)
	}
	var l raft.Log
	if err := decodeRaftLog(buf, &l); err != nil {
		return s.corrupt(key, err)
	}
	if l.Index != index {
		return s.corrupt(key, fmt.Errorf("value holds log index %d", l.Index))
	}
	*log = l
	return nil
}

// StoreLog stores one log entry, synced.
func (s *RaftStore) StoreLog(log *raft.Log) error {
	return s.StoreLogs([]*raft.Log{log})
}

// StoreLogs stores logs in one synced batch: all of them or none. An entry
// overwrites any entry stored at the same index. Indexes need not be
// contiguous.
func (s *RaftStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.guard.exit()
	size := 0
	for _, l := range logs {
		n, err := raftLogEncodedLen(l)
		if err != nil {
			return fmt.Errorf("storage: raft store partition %d: log index %d: %w", s.partition, l.Index, err)
		}
		size += raftLogKeyLen + n + 16 // 16: batch record overhead, roughly.
	}
	b := s.db.NewBatchWithSize(size)
	defer b.Close()
	for _, l := range logs {
		n, _ := raftLogEncodedLen(l)
		op := b.SetDeferred(raftLogKeyLen, n)
		copy(op.Key, s.logLower)
		binary.BigEndian.PutUint64(op.Key[3:], l.Index)
		putRaftLog(op.Value, l)
		if err := op.Finish(); err != nil {
			return fmt.Errorf("storage: raft store partition %d: %w", s.partition, err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("storage: raft store partition %d: store logs: %w", s.partition, err)
	}
	return nil
}

// DeleteRange deletes the log entries with index in [min, max], both ends
// inclusive, with one synced range deletion. It does nothing if min > max.
func (s *RaftStore) DeleteRange(min, max uint64) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.guard.exit()
	if min > max {
		return nil
	}
	start := s.appendLogKey(nil, min)
	end := s.logUpper // max == MaxUint64: up to the end of the log span.
	if max < math.MaxUint64 {
		end = s.appendLogKey(nil, max+1)
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange(start, end, nil); err != nil {
		return fmt.Errorf("storage: raft store partition %d: %w", s.partition, err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("storage: raft store partition %d: delete logs [%d, %d]: %w", s.partition, min, max, err)
	}
	return nil
}

// Set stores val under key, synced. A nil or empty val is stored as an
// empty value: Get then returns an empty, non-nil slice.
func (s *RaftStore) Set(key, val []byte) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.guard.exit()
	if err := s.db.Set(s.stableKey(key), val, pebble.Sync); err != nil {
		return fmt.Errorf("storage: raft store partition %d: set %q: %w", s.partition, key, err)
	}
	return nil
}

// Get returns a copy of the value stored under key, or nil and
// ErrStableKeyNotFound (message "not found", unwrapped) if key was never set.
func (s *RaftStore) Get(key []byte) ([]byte, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.guard.exit()
	k := s.stableKey(key)
	v, closer, err := s.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrStableKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("storage: raft store partition %d key %x: %w", s.partition, k, err)
	}
	out := make([]byte, len(v))
	copy(out, v)
	if err := closer.Close(); err != nil {
		return nil, fmt.Errorf("storage: raft store partition %d key %x: %w", s.partition, k, err)
	}
	return out, nil
}

// SetUint64 stores val under key as 8 bytes big-endian, synced.
func (s *RaftStore) SetUint64(key []byte, val uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], val)
	return s.Set(key, b[:])
}

// GetUint64 returns the value stored under key by SetUint64, or 0 and
// ErrStableKeyNotFound (unwrapped) if key was never set. A value that is not
// 8 bytes gives an error wrapping ErrCorrupt.
func (s *RaftStore) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, s.corrupt(s.stableKey(key), fmt.Errorf("uint64 value is %d bytes, want 8", len(v)))
	}
	return binary.BigEndian.Uint64(v), nil
}

// Encoding of a raft.Log, format version 1. Integers are big-endian.
//
//	offset  size  field
//	0       1     format version (1)
//	1       8     Index
//	9       8     Term
//	17      1     Type
//	18      1     flags: bit 0 set iff AppendedAt is not the zero time;
//	              other bits must be 0
//	19      8     AppendedAt as Unix nanoseconds (int64), 0 when bit 0 is
//	              clear; times outside 1678..2262 are clamped to that range
//	27      4     len(Data), then Data
//	..      4     len(Extensions), then Extensions; nothing follows
//
// The encoding is canonical: decodeRaftLog accepts exactly the bytes
// encodeRaftLog produces, so a value that decodes re-encodes identically.

// raftLogEncodedLen returns the encoded size of l, or an error if Data or
// Extensions is too long to encode.
func raftLogEncodedLen(l *raft.Log) (int, error) {
	if uint64(len(l.Data)) > math.MaxUint32 || uint64(len(l.Extensions)) > math.MaxUint32 {
		return 0, fmt.Errorf("log data or extensions longer than %d bytes", uint32(math.MaxUint32))
	}
	return raftLogHeaderLen + 4 + len(l.Data) + 4 + len(l.Extensions), nil
}

var (
	raftLogMinTime = time.Unix(0, math.MinInt64)
	raftLogMaxTime = time.Unix(0, math.MaxInt64)
)

// encodeRaftLog appends the encoding of l to dst. l must have passed
// raftLogEncodedLen.
func encodeRaftLog(dst []byte, l *raft.Log) []byte {
	n, _ := raftLogEncodedLen(l)
	dst = append(dst, make([]byte, n)...)
	putRaftLog(dst[len(dst)-n:], l)
	return dst
}

// putRaftLog writes the encoding of l into b, which must be exactly
// raftLogEncodedLen(l) bytes long.
func putRaftLog(b []byte, l *raft.Log) {
	var flags byte
	var nanos int64
	switch t := l.AppendedAt; {
	case t.IsZero():
	case t.Before(raftLogMinTime):
		flags, nanos = raftLogFlagAppendedAt, math.MinInt64
	case t.After(raftLogMaxTime):
		flags, nanos = raftLogFlagAppendedAt, math.MaxInt64
	default:
		flags, nanos = raftLogFlagAppendedAt, t.UnixNano()
	}
	if len(b) != raftLogHeaderLen+4+len(l.Data)+4+len(l.Extensions) {
		panic(fmt.Sprintf("storage: putRaftLog: buffer is %d bytes, log needs %d",
			len(b), raftLogHeaderLen+4+len(l.Data)+4+len(l.Extensions)))
	}
	b[0] = raftLogFormatV1
	binary.BigEndian.PutUint64(b[1:], l.Index)
	binary.BigEndian.PutUint64(b[9:], l.Term)
	b[17] = byte(l.Type)
	b[18] = flags
	binary.BigEndian.PutUint64(b[19:], uint64(nanos))
	b = b[raftLogHeaderLen:]
	binary.BigEndian.PutUint32(b, uint32(len(l.Data)))
	b = b[4+copy(b[4:], l.Data):]
	binary.BigEndian.PutUint32(b, uint32(len(l.Extensions)))
	copy(b[4:], l.Extensions)
}

// decodeRaftLog decodes b into l. It never panics; on malformed input it
// returns an error describing the defect and leaves l unspecified.
// l.Data and l.Extensions alias b (capacity capped, so appending to one
// cannot overwrite the other); they are nil when empty.
func decodeRaftLog(b []byte, l *raft.Log) error {
	if len(b) < raftLogHeaderLen+4 {
		return fmt.Errorf("log value is %d bytes, shorter than the %d-byte header", len(b), raftLogHeaderLen+4)
	}
	if b[0] != raftLogFormatV1 {
		return fmt.Errorf("unknown log format version %d", b[0])
	}
	l.Index = binary.BigEndian.Uint64(b[1:])
	l.Term = binary.BigEndian.Uint64(b[9:])
	l.Type = raft.LogType(b[17])
	flags := b[18]
	nanos := int64(binary.BigEndian.Uint64(b[19:]))
	switch flags {
	case 0:
		if nanos != 0 {
			return errors.New("log appended-at time present without its flag")
		}
		l.AppendedAt = time.Time{}
	case raftLogFlagAppendedAt:
		l.AppendedAt = time.Unix(0, nanos)
	default:
		return fmt.Errorf("unknown log flags %#x", flags)
	}
	rest := b[raftLogHeaderLen:]
	var err error
	if l.Data, rest, err = raftLogField(rest, "data"); err != nil {
		return err
	}
	if len(rest) < 4 {
		return errors.New("log value truncated before extensions length")
	}
	if l.Extensions, rest, err = raftLogField(rest, "extensions"); err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%d trailing bytes after log value", len(rest))
	}
	return nil
}

// raftLogField splits a length-prefixed field off b; len(b) >= 4.
func raftLogField(b []byte, name string) (field, rest []byte, err error) {
	n := uint64(binary.BigEndian.Uint32(b))
	b = b[4:]
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("log %s length %d exceeds the %d bytes left", name, n, len(b))
	}
	if n > 0 {
		field = b[:n:n]
	}
	return field, b[n:], nil
}
