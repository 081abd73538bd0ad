package storage

import (
	"cmp"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
)

// rowCache keeps, for recently used tasks, what their task and meta keys
// hold, so that the point reads of a task's life (the claim FSM reading
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
// The cache is bounded: each shard evicts its oldest inserted row when
// full.
type rowCache struct {
	shards [rowShards]rowShard
	gens   []atomic.Uint32 // per partition
}

// rowShards is the number of shards: 1<<6, as shard takes 6 bits.
const rowShards = 64

// defaultRowCacheRows bounds the rows kept: about 200 bytes each with a
// 64-byte payload.
const defaultRowCacheRows = 1 << 16

type row struct {
	enc    []byte // the task's stored encoding; nil when no task is stored
	m      meta
	mFound bool // a meta is stored
}

type rowKey struct {
	p  uint16
	id uint64
}

type rowShard struct {
	mu    sync.Mutex
	rows  map[rowKey]row
	order []rowKey // insertion ring: the slot to evict next is order[next]
	next  int
}

func newRowCache(capacity int) *rowCache {
	c := &rowCache{gens: make([]atomic.Uint32, 1<<16)}
	per := max(capacity/rowShards, 1)
	for i := range c.shards {
		c.shards[i].rows = make(map[rowKey]row)
		c.shards[i].order = make([]rowKey, 0, per)
	}
	return c
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
	r, ok := sh.rows[rowKey{p, id}]
	sh.mu.Unlock()
	return r, ok
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
	if _, ok := sh.rows[k]; ok {
		sh.rows[k] = r
		return
	}
	sh.putNewLocked(k, r)
}

// putNewLocked adds k, which is not cached, evicting the oldest row if the
// shard is full.
func (sh *rowShard) putNewLocked(k rowKey, r row) {
	if len(sh.order) < cap(sh.order) {
		sh.order = append(sh.order, k)
	} else {
		delete(sh.rows, sh.order[sh.next])
		sh.order[sh.next] = k
		sh.next = (sh.next + 1) % len(sh.order)
	}
	sh.rows[k] = r
}

// apply brings the cache in line with a committed batch's writes, in the
// order Pebble applied them. The caller holds the stripe locks of every
// id written. A cached row follows each write of its task or meta key; a
// row not cached is added when the batch wrote both its keys (an
// enqueue), and left out otherwise.
//
// The writes are grouped by shard (each key's writes kept in order), so each shard is locked once per batch and each row looked
// up once: on the enqueue benchmark the map of changes and the lock per
// row made apply 10% of a node's CPU.
func (c *rowCache) apply(ops []batchOp) {
	if c == nil {
		return
	}
	type write struct {
		k     rowKey
		shard uint8
		task  bool
		i     int // the op's place in ops: a key's writes stay in order
	}
	writes := make([]write, 0, len(ops))
	for i := range ops {
		k, isTask, ok := rowKeyOf(ops[i].key)
		if !ok {
			continue
		}
		writes = append(writes, write{k: k, shard: c.shardOf(k.id), task: isTask, i: i})
	}
	slices.SortFunc(writes, func(a, b write) int {
		return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.k.p, b.k.p), cmp.Compare(a.k.id, b.k.id), cmp.Compare(a.i, b.i))
	})
	var sh *rowShard
	for i := 0; i < len(writes); {
		k := writes[i].k
		if next := &c.shards[writes[i].shard]; next != sh {
			if sh != nil {
				sh.mu.Unlock()
			}
			sh = next
			sh.mu.Lock()
		}
		// The row's writes, in order: the last of each key wins.
		var r row
		var task, metaSeen bool
		for ; i < len(writes) && writes[i].k == k; i++ {
			op := &ops[writes[i].i]
			if writes[i].task {
				task = true
				r.enc = nil
				if !op.del {
					r.enc = op.value
				}
				continue
			}
			metaSeen = true // a write, or a known absence (batchOp.absent)
			r.m, r.mFound = meta{}, false
			if !op.del {
				if m, ok := decodeMeta(op.value); ok {
					r.m, r.mFound = m, true
				}
			}
		}
		cur, ok := sh.rows[k]
		switch {
		case ok:
			if task {
				cur.enc = r.enc
			}
			if metaSeen {
				cur.m, cur.mFound = r.m, r.mFound
			}
			sh.rows[k] = cur
		case task && metaSeen:
			sh.putNewLocked(k, r)
		}
	}
	if sh != nil {
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
		for k := range sh.rows {
			if k.p == p {
				delete(sh.rows, k)
			}
		}
		sh.mu.Unlock()
	}
}

// rowKeyOf parses a task or meta key.
func rowKeyOf(key []byte) (k rowKey, isTask, ok bool) {
	if len(key) != 3+8 || (key[2] != tagTask && key[2] != tagMeta) {
		return rowKey{}, false, false
	}
	return rowKey{p: binary.BigEndian.Uint16(key), id: binary.BigEndian.Uint64(key[3:])}, key[2] == tagTask, true
}
