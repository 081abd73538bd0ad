package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestHashIDPinned pins the hash of a few ids: HashID decides where every
// stored task lives, so it must never change (byte order included).
func TestHashIDPinned(t *testing.T) {
	for _, tc := range []struct {
		id   uint64
		want uint64
	}{
		{0, 0x34c96acdcadb1bbb},
		{1, 0x9f1ffc793b8a47da},
		{0x0102030405060708, 0x814c43eb29646e14},
		{^uint64(0), 0x85d136adb773c6c9},
	} {
		if got := HashID(tc.id); got != tc.want {
			t.Errorf("HashID(%#x) = %#x, want %#x", tc.id, got, tc.want)
		}
	}
}

func TestHashIDIsXXHashOfBigEndian(t *testing.T) {
	for _, id := range []uint64{0, 1, 42, 1 << 40, 0xdeadbeefcafebabe} {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], id)
		if got, want := HashID(id), xxhash.Sum64(b[:]); got != want {
			t.Errorf("HashID(%d) = %#x, want xxhash of big-endian bytes %#x", id, got, want)
		}
	}
}

func TestPartition(t *testing.T) {
	for _, tc := range []struct {
		id   uint64
		p    int
		want int
	}{
		{0, 1, 0},
		{12345, 1, 0},
		{0, 64, int(0x34c96acdcadb1bbb & 63)},
		{1, 64, int(0x9f1ffc793b8a47da & 63)},
		{1, 2, int(0x9f1ffc793b8a47da & 1)},
		{^uint64(0), MaxPartitions, int(0x85d136adb773c6c9 & 0xffff)},
	} {
		if got := Partition(tc.id, tc.p); got != tc.want {
			t.Errorf("Partition(%d, %d) = %d, want %d", tc.id, tc.p, got, tc.want)
		}
	}
	// Low bits, not high bits: doubling P splits partition i into i and i+P.
	for id := range uint64(1000) {
		for p := 1; p < MaxPartitions; p *= 2 {
			got, wide := Partition(id, p), Partition(id, 2*p)
			if wide != got && wide != got+p {
				t.Fatalf("Partition(%d, %d) = %d but Partition(%d, %d) = %d: not the low bits", id, p, got, id, 2*p, wide)
			}
			if uint64(got) != HashID(id)&uint64(p-1) {
				t.Fatalf("Partition(%d, %d) = %d, want low bits of HashID %d", id, p, got, HashID(id)&uint64(p-1))
			}
		}
	}
}

func TestPartitionPanicsOnBadCount(t *testing.T) {
	for _, p := range []int{0, -1, 3, 100, 2 * MaxPartitions} {
		t.Run(fmt.Sprint(p), func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Partition(1, %d) did not panic", p)
				}
			}()
			Partition(1, p)
		})
	}
}

func TestValidatePartitions(t *testing.T) {
	for _, tc := range []struct {
		p  int
		ok bool
	}{
		{-64, false},
		{-1, false},
		{0, false},
		{1, true},
		{2, true},
		{3, false},
		{48, false},
		{64, true},
		{100, false},
		{1024, true},
		{MaxPartitions, true},
		{MaxPartitions + 1, false},
		{2 * MaxPartitions, false},
		{1 << 62, false},
	} {
		err := ValidatePartitions(tc.p)
		if tc.ok && err != nil {
			t.Errorf("ValidatePartitions(%d) = %v, want nil", tc.p, err)
		}
		if !tc.ok && !errors.Is(err, ErrBadPartitionCount) {
			t.Errorf("ValidatePartitions(%d) = %v, want ErrBadPartitionCount", tc.p, err)
		}
	}
}

// TestPartitionDistribution: sonyflake ids are close to sequential, and they
// must still spread evenly over the partitions.
func TestPartitionDistribution(t *testing.T) {
	const ids, p = 1 << 20, 64
	var counts [p]int
	for id := range uint64(ids) {
		counts[Partition(id, p)]++
	}
	mean := ids / p
	for part, c := range counts {
		if c < mean*97/100 || c > mean*103/100 {
			t.Errorf("partition %d got %d of %d sequential ids, want within 3%% of %d", part, c, ids, mean)
		}
	}
	// Sonyflake-shaped ids: time in the high bits, a sequence and a machine
	// id in the low 24 bits.
	clear(counts[:])
	for k := range uint64(ids) {
		id := (1_000_000+k/256)<<24 | (k%256)<<16 | 7
		counts[Partition(id, p)]++
	}
	for part, c := range counts {
		if c < mean*97/100 || c > mean*103/100 {
			t.Errorf("partition %d got %d of %d sonyflake-shaped ids, want within 3%% of %d", part, c, ids, mean)
		}
	}
}

// KeyPartition must never change: it decides which group holds every
// stored unique key.
func TestKeyPartitionFixed(t *testing.T) {
	if got := KeyPartition("emails", "report:42", MaxPartitions); got != 53541 {
		t.Fatalf("KeyPartition(emails, report:42) = %d, pinned 53541", got)
	}
	if got := KeyPartition("q", "", MaxPartitions); got != 26161 {
		t.Fatalf("KeyPartition(q, \"\") = %d, pinned 26161", got)
	}
	seen := map[int]bool{}
	for i := range 64 {
		seen[KeyPartition("q", fmt.Sprint(i), 64)] = true
	}
	if len(seen) < 32 {
		t.Fatalf("64 keys fall in %d of 64 partitions", len(seen))
	}
	if KeyPartition("a", "bc", 1<<16) == KeyPartition("ab", "c", 1<<16) && KeyPartition("a", "b", 1<<16) == KeyPartition("ab", "", 1<<16) {
		t.Fatal("the queue and key are not apart")
	}
}
