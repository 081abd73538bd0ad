package storage

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// rowCache keeps, for recently used tasks, what their task and meta keys
// hold, and their claim FSM record once read or written, so that the point reads of a task's life (the claim FSM reading
// the index state on every replica, the leader checking a claim, each
// replica joining a completion into the stored state) do not each search
// the memtables and sstables. A Pebble Get was about 5.6 µs on the
// claim+complete benchmark, with about 28 of them per task across the
// cluster.
//
// Coherence rests on the id stripe locks: every write of a task or meta
// key happens under its id's stripe lock, and the writer applies its
// batch's writes to the cache after the batch is visible and before it
// unlocks (apply). A read that misses fills the cache only when its
// caller holds the stripe lock (fill), so no write can fall between its
// Pebble read and the fill. Readers without the lock only look. A
// partition drop deletes without the stripe locks: it bumps the
// partition's generation first, and a fill that read under an older
// generation is dropped.
//
// A row's claim FSM record is known to the cache (recKnown) once the
// partition's FSM wrote it, or read it through ClaimFSMRecordForApply:
// the FSM goroutine is the only writer of its partition's records, so its
// own read cannot race with a write. Other readers only look. A
// snapshot's restore, which replaces every record of a partition, forgets
// them (forgetRecords).
//
// The cache is bounded and set-associative: a row's id picks its shard
// and, within it, a set of rowWays slots; a new row takes a free slot of
// its set or evicts the set's oldest. A Go map per shard cost about 430
// ns per lookup on the enqueue benchmark (a 16-byte struct key hashed
// field by field, then probed), two thirds of the cache's time; a set's
// keys share two cache lines.
type rowCache struct {
	shards [rowShards]rowShard
	gens   []atomic.Uint32 // per partition
}

// rowShards is the number of shards: 1<<6, as shard takes 6 bits.
const rowShards = 64

// defaultRowCacheRows bounds the rows kept: about 250 bytes each with a
// 64-byte payload and a claim record, so about 65 MB when full (the empty
// slots take about 100 bytes each). A set-associative cache keeps all of a
// working set only well below its capacity: at three quarters full about
// 6% of the rows find their set full (Poisson occupancy of 8 ways), and
// the claim+complete benchmark's 50,000 tasks missed at 1 << 16.
const defaultRowCacheRows = 1 << 18

type row struct {
	enc    []byte // the task's stored encoding; nil when no task is stored
	m      meta
	mFound bool // a meta is stored
	// rec is the claim FSM record when recKnown (nil: none stored).
	rec      []byte
	recKnown bool
}

type rowKey struct {
	p  uint16
	id uint64
}

// rowWays is the number of slots of a set.
const rowWays = 8

// rowSlot is the key half of a slot; its row is in rowShard.rows at the
// same index.
type rowSlot struct {
	id    uint64
	p     uint16
	used  bool
	stamp uint32 // insertion order within the shard: the oldest is evicted first
}

type rowShard struct {
	mu      sync.Mutex
	slots   []rowSlot // sets of rowWays
	rows    []row
	setMask uint64
	clock   uint32
}

func newRowCache(capacity int) *rowCache {
	c := &rowCache{gens: make([]atomic.Uint32, 1<<16)}
	sets := 1
	for sets*rowWays*rowShards < capacity {
		sets <<= 1
	}
	for i := range c.shards {
		c.shards[i].slots = make([]rowSlot, sets*rowWays)
		c.shards[i].rows = make([]row, sets*rowWays)
		c.shards[i].setMask = uint64(sets - 1)
	}
	return c
}

// len returns how many rows the shard holds.
func (sh *rowShard) len() int {
	n := 0
	for _, sl := range sh.slots {
		if sl.used {
			n++
		}
	}
	return n
}

// set returns the first slot of id's set in the shard: the hash bits below
// the shard's.
func (sh *rowShard) set(id uint64) int {
	return int(((id*0x9E3779B97F4A7C15)>>(64-6-32))&sh.setMask) * rowWays
}

// find returns the slot of k, or -1.
func (sh *rowShard) find(k rowKey) int {
	base := sh.set(k.id)
	for i := base; i < base+rowWays; i++ {
		if sl := &sh.slots[i]; sl.used && sl.id == k.id && sl.p == k.p {
			return i
		}
	}
	return -1
}

// shard spreads ids over the shards by Fibonacci hashing, as stripeOf
// does: a sonyflake id's low bits are its coordinator's machine id and its
// middle bits a sequence that restarts every 10 ms, so any few bits of the
// id itself would crowd a few shards (4 of 64 at 500 enqueues per second,
// leaving the cache a sixteenth of its rows).
func (c *rowCache) shard(id uint64) *rowShard { return &c.shards[c.shardOf(id)] }

func (c *rowCache) shardOf(id uint64) uint8 { return uint8((id * 0x9E3779B97F4A7C15) >> (64 - 6)) }

// lookup returns the cached row of id in partition p.
func (c *rowCache) lookup(p uint16, id uint64) (row, bool) {
	if c == nil {
		return row{}, false
	}
	sh := c.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i := sh.find(rowKey{p, id}); i >= 0 {
		return sh.rows[i], true
	}
	return row{}, false
}

// gen returns partition p's generation, to pass to fill.
func (c *rowCache) gen(p uint16) uint32 {
	if c == nil {
		return 0
	}
	return c.gens[p].Load()
}

// fill caches r, read from Pebble under id's stripe lock while p's
// generation was gen.
func (c *rowCache) fill(p uint16, id uint64, r row, gen uint32) {
	if c == nil {
		return
	}
	sh := c.shard(id)
	sh.mu.Lock()
	if c.gens[p].Load() == gen {
		sh.putLocked(rowKey{p, id}, r)
	}
	sh.mu.Unlock()
}

func (sh *rowShard) putLocked(k rowKey, r row) {
	if i := sh.find(k); i >= 0 {
		sh.rows[i] = r
		return
	}
	sh.putNewLocked(k, r)
}

// putNewLocked adds k, which is not cached, into a free slot of its set
// or in place of the set's oldest row.
func (sh *rowShard) putNewLocked(k rowKey, r row) {
	base := sh.set(k.id)
	victim := base
	for i := base; i < base+rowWays; i++ {
		if !sh.slots[i].used {
			victim = i
			break
		}
		if sh.clock-sh.slots[i].stamp > sh.clock-sh.slots[victim].stamp {
			victim = i
		}
	}
	sh.clock++
	sh.slots[victim] = rowSlot{id: k.id, p: k.p, used: true, stamp: sh.clock}
	sh.rows[victim] = r
}

// apply brings the cache in line with a committed batch's writes. ops
// are the batch's writes in key order (sortedBatch.build sorts them; a
// key's writes in the order they were made). The caller holds the stripe
// locks of every id written. A cached row follows each write of its task
// or meta key or claim record; a row not cached is added when the batch
// wrote both its task and meta keys (an enqueue), and left out otherwise.
//
// In key order a partition's task keys come first, then its meta keys,
// then its claim records, each run in id order; so the three kinds of
// writes are three lists sorted by (partition, id), and one merge of them
// yields each row's writes without a sort (sorting by shard was 5% of a
// node's CPU on the enqueue benchmark). Each row locks its shard on its
// own.
func (c *rowCache) apply(ops []batchOp) {
	if c == nil {
		return
	}
	var lists [rowKinds][]int // indexes into ops, by kind
	for i := range ops {
		if _, kind, ok := rowKeyOf(ops[i].key); ok {
			lists[kind] = append(lists[kind], i)
		}
	}
	keyOf := func(i int) rowKey { k, _, _ := rowKeyOf(ops[i].key); return k }
	less := func(a, b rowKey) bool { return a.p < b.p || (a.p == b.p && a.id < b.id) }
	var at [rowKinds]int
	for {
		var k rowKey
		found := false
		for kind := range lists {
			if at[kind] < len(lists[kind]) {
				if kk := keyOf(lists[kind][at[kind]]); !found || less(kk, k) {
					k, found = kk, true
				}
			}
		}
		if !found {
			return
		}
		// The row's writes, in order: the last of each key wins.
		var r row
		var seen [rowKinds]bool
		for kind := range lists {
			for ; at[kind] < len(lists[kind]) && keyOf(lists[kind][at[kind]]) == k; at[kind]++ {
				op := &ops[lists[kind][at[kind]]]
				seen[kind] = true // a write, or a known absence (batchOp.absent)
				switch kind {
				case rowTask:
					r.enc = nil
					if !op.del {
						r.enc = op.value
					}
				case rowMeta:
					r.m, r.mFound = meta{}, false
					if !op.del {
						if m, ok := decodeMeta(op.value); ok {
							r.m, r.mFound = m, true
						}
					}
				case rowRecord:
					r.rec, r.recKnown = nil, true
					if !op.del {
						r.rec = op.value
					}
				}
			}
		}
		sh := c.shard(k.id)
		sh.mu.Lock()
		switch i := sh.find(k); {
		case i >= 0:
			cur := &sh.rows[i]
			if seen[rowTask] {
				cur.enc = r.enc
			}
			if seen[rowMeta] {
				cur.m, cur.mFound = r.m, r.mFound
			}
			if seen[rowRecord] {
				cur.rec, cur.recKnown = r.rec, true
			}
		case seen[rowTask] && seen[rowMeta]:
			sh.putNewLocked(k, r)
		}
		sh.mu.Unlock()
	}
}

// fillRecord caches the claim record of a cached row of partition p, read
// by the partition's FSM goroutine (see rowCache) while p's generation
// was gen; rec nil: none stored.
func (c *rowCache) fillRecord(p uint16, id uint64, rec []byte, gen uint32) {
	if c == nil {
		return
	}
	sh := c.shard(id)
	sh.mu.Lock()
	if i := sh.find(rowKey{p, id}); i >= 0 && c.gens[p].Load() == gen {
		sh.rows[i].rec, sh.rows[i].recKnown = rec, true
	}
	sh.mu.Unlock()
}

// forgetRecords forgets the claim records of every row of p.
func (c *rowCache) forgetRecords(p uint16) {
	if c == nil {
		return
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			if sh.slots[j].used && sh.slots[j].p == p {
				sh.rows[j].rec, sh.rows[j].recKnown = nil, false
			}
		}
		sh.mu.Unlock()
	}
}

// dropPartition forgets every row of p, and fills that read p before.
func (c *rowCache) dropPartition(p uint16) {
	if c == nil {
		return
	}
	c.gens[p].Add(1)
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			if sl := &sh.slots[j]; sl.used && sl.p == p {
				sl.used = false
				sh.rows[j] = row{}
			}
		}
		sh.mu.Unlock()
	}
}

// The kinds of keys a row caches.
const (
	rowTask = iota
	rowMeta
	rowRecord
	rowKinds
)

// rowKeyOf parses a task or meta key or a claim FSM record key.
func rowKeyOf(key []byte) (k rowKey, kind int, ok bool) {
	switch {
	case len(key) == 3+8 && key[2] == tagTask:
		kind = rowTask
	case len(key) == 3+8 && key[2] == tagMeta:
		kind = rowMeta
	case len(key) == 4+8 && key[2] == tagClaimFSM && key[3] == fsmRecord:
		kind = rowRecord
	default:
		return rowKey{}, 0, false
	}
	return rowKey{p: binary.BigEndian.Uint16(key), id: binary.BigEndian.Uint64(key[len(key)-8:])}, kind, true
}
