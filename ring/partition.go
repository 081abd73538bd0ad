package ring

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

const (
	// MaxPartitions is the largest partition count P. Partition uses the low
	// bits of HashID and storage uses its top 16 bits for anti-entropy
	// segments; capping P at 2^16 keeps the two sets of bits disjoint.
	MaxPartitions = 1 << 16

	// DefaultPartitions is the partition count of a new cluster (DESIGN §1).
	DefaultPartitions = 64

	// DefaultReplication is the replication factor N of a new cluster.
	DefaultReplication = 3
)

// HashID returns the 64-bit hash of a task id: xxhash64 of the id's 8-byte
// big-endian encoding. It is the only hash of task ids in Norn: Partition
// takes its low bits, storage's anti-entropy segments its top 16 bits. It
// must never change: it decides where every stored task lives.
func HashID(id uint64) uint64 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], id)
	return xxhash.Sum64(b[:])
}

// Partition returns the partition, in [0, p), that owns task id: the low
// log2(p) bits of HashID(id). p must be a valid partition count (see
// ValidatePartitions); Partition panics otherwise, since a bad p is a
// configuration bug that must have been rejected at startup.
func Partition(id uint64, p int) int {
	if !validPartitions(p) {
		panic(fmt.Sprintf("ring: Partition called with invalid partition count %d", p))
	}
	return int(HashID(id) & uint64(p-1))
}

// KeyPartition returns the partition, in [0, p), that decides the unique
// key key of queue (docs/SCHEDULING.md): the low log2(p) bits of the
// xxhash64 of queue, a 0 byte and key. Like HashID it must never change.
func KeyPartition(queue, key string, p int) int {
	if !validPartitions(p) {
		panic(fmt.Sprintf("ring: KeyPartition called with invalid partition count %d", p))
	}
	d := xxhash.New()
	d.WriteString(queue)
	d.Write([]byte{0})
	d.WriteString(key)
	return int(d.Sum64() & uint64(p-1))
}

// ValidatePartitions returns nil if p is a usable partition count: a power
// of two in [1, MaxPartitions]. Otherwise it returns an error wrapping
// ErrBadPartitionCount.
func ValidatePartitions(p int) error {
	if !validPartitions(p) {
		return fmt.Errorf("ring: partition count %d is not a power of two in [1, %d]: %w",
			p, MaxPartitions, ErrBadPartitionCount)
	}
	return nil
}

func validPartitions(p int) bool {
	return p >= 1 && p <= MaxPartitions && p&(p-1) == 0
}
