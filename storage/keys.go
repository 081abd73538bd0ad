package storage

import (
	"encoding/binary"

	"github.com/norn-dev/norn/ring"
)

// Key tags: the byte after the 2-byte partition. See the package doc for the
// full layout.
const (
	tagTask      byte = 0x01 // id -> canonical crdt.Task encoding
	tagReady     byte = 0x02 // retired in format 4: queue 0x00 prio id -> empty
	tagDelayed   byte = 0x03 // retired in format 5: notBefore id -> empty
	tagClaimed   byte = 0x04 // retired in format 5: expiry id -> empty
	tagSegment   byte = 0x05 // retired in format 3: segment id -> digest
	tagMeta      byte = 0x06 // id -> local index state
	tagTerminal  byte = 0x07 // retired in format 7: terminalMs id -> empty (retention)
	tagCount     byte = 0x08 // queue 0x00 class -> int64 counter (merged)
	tagWaiting   byte = 0x09 // id -> empty: ready with dependencies
	tagQueue     byte = 0x0a // queue 0x00 id -> empty: the queue index (format 6)
	tagTerminalQ byte = 0x0b // queue 0x00 terminalMs id -> empty: the retention index (format 7)
	tagRaftLog   byte = 0x10 // used by RaftStore
	tagRaftKV    byte = 0x11 // used by RaftStore
	tagClaimFSM  byte = 0x12 // reserved for the claim FSM (claims/)
)

// tagDeadline names the in-memory deadline index (deadline id), kept
// beside the delayed and claimed indexes; it is never a key's tag.
const tagDeadline byte = 0xd0

// SegmentBits is the width of the anti-entropy segment number of the
// segment index: 2^16 segments per partition, which any tree of up to 65536
// leaves can group by prefix.
const SegmentBits = 16

// Segment returns the anti-entropy segment of id: the top SegmentBits bits of
// ring.HashID(id). ring.Partition uses the low bits of the same hash, so
// segments spread evenly within every partition.
func Segment(id uint64) uint16 { return uint16(ring.HashID(id) >> (64 - SegmentBits)) }

func partitionPrefix(p uint16, tag byte) []byte {
	return []byte{byte(p >> 8), byte(p), tag}
}

// partitionSpan returns [start, end) covering every key of partition p.
// Tags are below 0xff, so (p, 0xff) bounds them all.
func partitionSpan(p uint16) (start, end []byte) {
	return []byte{byte(p >> 8), byte(p)}, []byte{byte(p >> 8), byte(p), 0xff}
}

// tagSpan returns [start, end) covering every key of one tag of partition p.
func tagSpan(p uint16, tag byte) (start, end []byte) {
	return partitionPrefix(p, tag), partitionPrefix(p, tag+1)
}

func idKey(p uint16, tag byte, id uint64) []byte {
	return binary.BigEndian.AppendUint64(partitionPrefix(p, tag), id)
}

func taskKey(p uint16, id uint64) []byte { return idKey(p, tagTask, id) }
func metaKey(p uint16, id uint64) []byte { return idKey(p, tagMeta, id) }

// timeIDKey is the layout of the delayed and claimed indexes: a time in Unix
// ms (clamped at zero, so that the big-endian order is the numeric order),
// then the id.
func timeIDKey(p uint16, tag byte, ms int64, id uint64) []byte {
	k := binary.BigEndian.AppendUint64(partitionPrefix(p, tag), uint64(max(ms, 0)))
	return binary.BigEndian.AppendUint64(k, id)
}

// prefixEnd returns the smallest key greater than every key with prefix
// (the prefix's last byte incremented; prefixes here never end in 0xff).
func prefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	end[len(end)-1]++
	return end
}
