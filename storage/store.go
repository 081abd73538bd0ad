package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/norn-dev/norn/crdt"
)

// Config configures a Store.
type Config struct {
	// Dir is the database directory. Required.
	Dir string
	// FS is the filesystem Pebble runs on; nil means the OS filesystem.
	// Tests pass vfs.NewCrashableMem().
	FS vfs.FS
	// Clock decides at write time whether a new task with a not-before time
	// goes to the delayed or the ready index. Default crdt.SystemClock.
	Clock crdt.Clock
	// CacheBytes is Pebble's block cache size. Default 64 MiB.
	CacheBytes int64
	// Logger receives Pebble's log output; nil discards informational
	// messages and keeps errors on standard error.
	Logger pebble.Logger
	// OnReady, if set, is called after every commit that made tasks of a
	// queue ready (enqueue, a yield or expiry applied by the claim FSM,
	// a delayed task promoted), once per queue and partition. It runs on
	// the committing goroutine, after the commit: it must not block or
	// call back into the Store.
	OnReady func(p uint16, queue string)
	// AckBeforeSync is a seeded bug for the Jepsen harness (nornd
	// -test-bug ack-before-sync), test-only: MergeTasks commits without
	// syncing the WAL (pebble.NoSync) and returns at once, so a power loss
	// loses writes it acknowledged. Never set it in production.
	AckBeforeSync bool
}

// Validate reports a missing or out-of-range field.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return errors.New("storage: Config.Dir is required")
	}
	if c.CacheBytes < 0 {
		return errors.New("storage: Config.CacheBytes must not be negative")
	}
	return nil
}

// lockStripes is the number of per-id mutexes serializing read-modify-writes
// of one task.
const lockStripes = 1024

// Store is one node's Pebble database: task states, their local indexes, the
// anti-entropy segment index and (through RaftStore) every partition's Raft
// log. It is safe for concurrent use.
type Store struct {
	db      *pebble.DB
	clock   crdt.Clock
	onReady func(p uint16, queue string) // Config.OnReady
	noSync  bool                         // Config.AckBeforeSync (a seeded bug)

	stripes [lockStripes]sync.Mutex

	// dropMu orders task merges (readers) before and after partition drops
	// (writer); dropped holds the partitions dropped and not reopened, whose
	// merges fail with ErrPartitionDropped.
	dropMu  sync.RWMutex
	dropped map[uint16]bool

	horizons       idHorizons // ids above which no task or meta is stored
	digests        digestSinks
	deleteHorizon  deleteHorizon
	recordHorizons idHorizons // ids above which no claim FSM record is stored

	headsMu      sync.Mutex
	heads        map[queueKey]*readyHead
	headCacheLen int // keys per queue head cache; tests lower it

	// testHookRefillRead, when set, runs after a head-cache refill has read
	// Pebble and before it installs the result.
	testHookRefillRead func()
}

// Open opens (creating if needed) the store in cfg.Dir.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = crdt.SystemClock{}
	}
	if cfg.CacheBytes == 0 {
		cfg.CacheBytes = 64 << 20
	}
	cache := pebble.NewCache(cfg.CacheBytes)
	defer cache.Unref()
	opts := &pebble.Options{
		FS:     cfg.FS,
		Cache:  cache,
		Logger: cfg.Logger,
		// 16 MiB memtables (Pebble's default is 4 MiB): a replica writes
		// about five keys per task, and small memtables flush into many
		// small L0 files that compactions then rewrite. Measured with the
		// 3-node enqueue benchmark: 4 MiB 6.7 s of CPU per 100k tasks,
		// 16 MiB 5.8 s, 32 MiB 6.7 s (deeper skiplists cost more than the
		// saved compactions). A new DB starts at 256 KiB and grows.
		MemTableSize: 16 << 20,
	}
	if opts.Logger == nil {
		opts.Logger = quietLogger{}
	}
	// Bloom filters on every level: most point reads on the hot paths
	// (meta, claim records, tasks a replica has not seen) look up keys in
	// sstables that do not hold them; without filters each such Get reads
	// index blocks of every level.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w", cfg.Dir, err)
	}
	return &Store{db: db, clock: cfg.Clock, onReady: cfg.OnReady, noSync: cfg.AckBeforeSync, heads: make(map[queueKey]*readyHead), headCacheLen: defaultHeadCacheLen,
		horizons: idHorizons{db: db, spans: stateSpans}, recordHorizons: idHorizons{db: db, spans: recordSpans}}, nil
}

// Close closes the database. Calls after Close fail or panic as Pebble does;
// callers stop their users first.
func (s *Store) Close() error { return s.db.Close() }

// RaftStore returns the raft.LogStore and raft.StableStore of partition p.
func (s *Store) RaftStore(p uint16) *RaftStore { return NewRaftStore(s.db, p) }

// IndexState is where a task currently sits in this replica's local
// indexes. It is local bookkeeping, not part of the replicated CRDT.
type IndexState uint8

// Index states.
const (
	IndexNone    IndexState = 0 // no spec yet, or terminal: in no index
	IndexReady   IndexState = 1 // in the ready index
	IndexDelayed IndexState = 2 // in the delayed index (not_before in the future)
	IndexClaimed IndexState = 3 // in the claimed index (by lease expiry)
)

func (s IndexState) String() string {
	switch s {
	case IndexNone:
		return "none"
	case IndexReady:
		return "ready"
	case IndexDelayed:
		return "delayed"
	case IndexClaimed:
		return "claimed"
	}
	return fmt.Sprintf("IndexState(%d)", uint8(s))
}

// meta is the value under the meta key: the index state and, when claimed,
// the lease expiry that keys the claimed index.
type meta struct {
	state    IndexState
	expiryMs int64
}

func (m meta) encode() []byte {
	if m.state == IndexClaimed {
		return binary.BigEndian.AppendUint64([]byte{byte(m.state)}, uint64(m.expiryMs))
	}
	return []byte{byte(m.state)}
}

func decodeMeta(b []byte) (meta, bool) {
	switch {
	case len(b) == 1 && IndexState(b[0]) <= IndexDelayed:
		return meta{state: IndexState(b[0])}, true
	case len(b) == 9 && IndexState(b[0]) == IndexClaimed:
		return meta{state: IndexClaimed, expiryMs: int64(binary.BigEndian.Uint64(b[1:]))}, true
	}
	return meta{}, false
}

// StoredTask is a task as this replica holds it.
type StoredTask struct {
	Partition uint16
	Task      *crdt.Task
	Digest    uint64     // crdt.Digest of the stored encoding
	Index     IndexState // local index placement
	ExpiryMs  int64      // lease expiry when Index is IndexClaimed
}

// MergeItem is one task state to merge into partition Partition.
type MergeItem struct {
	Partition uint16
	Task      *crdt.Task
}

// MergeResult reports what a merge did to one task.
type MergeResult struct {
	ID           uint64
	Existed      bool   // the replica held a state for the id before
	OldDigest    uint64 // digest before the merge; 0 when !Existed
	NewDigest    uint64 // digest after the merge
	SpecConflict bool   // the stored and incoming specs differed (see crdt.Join)
}

// Changed reports whether the merge changed the stored state.
func (r MergeResult) Changed() bool { return !r.Existed || r.OldDigest != r.NewDigest }

// MergeTask joins t into the state stored for t.ID in partition p and
// writes the result, with the ready, delayed, segment and meta entries, in
// one synced batch. See MergeTasks.
func (s *Store) MergeTask(p uint16, t *crdt.Task) (MergeResult, error) {
	res, err := s.MergeTasks([]MergeItem{{Partition: p, Task: t}})
	if err != nil {
		return MergeResult{}, err
	}
	return res[0], nil
}

// MergeTasks joins every item into its stored state and commits all of them
// in one synced batch (one fsync for the whole batch, shared with concurrent
// callers by Pebble's group commit). When it returns nil, every result is
// durable. Results are in item order; items for the same task are joined
// together first and report the same result.
//
// Per task the write is a read-modify-write under a per-id lock: concurrent
// merges of one id never lose each other's events.
func (s *Store) MergeTasks(items []MergeItem) ([]MergeResult, error) {
	// Lock the stripes of every id, in order, so that batches cannot
	// deadlock each other.
	ids := make([]uint64, len(items))
	for i, it := range items {
		ids[i] = it.Task.ID
	}
	s.dropMu.RLock()
	for _, it := range items {
		if s.dropped[it.Partition] {
			s.dropMu.RUnlock()
			return nil, fmt.Errorf("%w: partition %d", ErrPartitionDropped, it.Partition)
		}
	}
	unlockIDs := s.lockIDs(ids)
	unlock := func() { unlockIDs(); s.dropMu.RUnlock() }

	results, batch, changes, digests, err := s.prepareMerge(items)
	if err != nil {
		unlock()
		return nil, err
	}
	if batch == nil {
		// Nothing changed. An earlier write of these states may be visible
		// but not yet synced (see below), so sync the WAL before acking.
		unlock()
		if s.noSync {
			return results, nil // the seeded bug: no sync
		}
		if err := s.db.LogData(nil, pebble.Sync); err != nil {
			return nil, fmt.Errorf("storage: sync: %w", err)
		}
		return results, nil
	}
	// Publish under the locks, then release them before waiting for the
	// fsync, so that the next writer of the same ids pipelines behind this
	// batch instead of waiting out its fsync. Pebble makes a batch visible
	// before its WAL sync either way. The seeded bug AckBeforeSync commits
	// without a sync.
	if s.noSync {
		err = s.db.Apply(batch, pebble.NoSync)
	} else {
		err = s.db.ApplyNoSyncWait(batch, pebble.Sync)
	}
	if err == nil {
		s.notifyDigests(digests)
	}
	unlock()
	if err == nil {
		s.noteReadyChanges(changes)
		if !s.noSync {
			err = batch.SyncWait()
		}
	}
	batch.Close()
	if err != nil {
		return nil, fmt.Errorf("storage: commit: %w", err)
	}
	return results, nil
}

// prepareMerge reads the stored states, joins, and builds the batch. It
// returns a nil batch when no state changed. The caller holds the stripes.
func (s *Store) prepareMerge(items []MergeItem) ([]MergeResult, *pebble.Batch, []readyChange, []digestChange, error) {
	type key struct {
		p  uint16
		id uint64
	}
	// Join duplicates first so that each task is read and written once.
	merged := make(map[key]*crdt.Task, len(items))
	conflicts := make(map[key]bool)
	order := make([]key, 0, len(items))
	for _, it := range items {
		k := key{it.Partition, it.Task.ID}
		prev, ok := merged[k]
		if !ok {
			merged[k] = it.Task
			order = append(order, k)
			continue
		}
		j, conflict, err := crdt.Join(prev, it.Task)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		merged[k] = j
		conflicts[k] = conflicts[k] || conflict
	}

	now := s.clock.Now().UnixMilli()
	var batch *pebble.Batch
	var changes []readyChange
	var digests []digestChange
	byKey := make(map[key]MergeResult, len(order))
	// Which tasks are new here, decided for all before any horizon rises.
	unseen := make([]bool, len(order))
	for i, k := range order {
		var err error
		if unseen[i], err = s.horizons.above(k.p, k.id); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	for i, k := range order {
		in := merged[k]
		res := MergeResult{ID: k.id, SpecConflict: conflicts[k]}
		var old *StoredTask
		var err error
		if !unseen[i] {
			old, err = s.getTask(k.p, k.id)
			switch {
			case errors.Is(err, ErrNotFound):
				old = nil
			case err != nil:
				return nil, nil, nil, nil, err
			}
		}
		out := in
		if old != nil {
			res.Existed, res.OldDigest = true, old.Digest
			j, conflict, err := crdt.Join(old.Task, in)
			if err != nil {
				return nil, nil, nil, nil, err
			}
			out = j
			res.SpecConflict = res.SpecConflict || conflict
		} else {
			out = cloneNormalized(in)
		}
		enc := out.Encode()
		res.NewDigest = crdt.Digest(enc)
		byKey[k] = res
		if !res.Changed() {
			continue
		}
		if old == nil && s.pastHorizon(out) {
			continue // deleted by retention: not brought back
		}
		digests = append(digests, digestChange{p: k.p, id: k.id, old: res.OldDigest, had: res.Existed, new: res.NewDigest, has: true})
		if batch == nil {
			batch = s.db.NewBatch()
		}
		if err := batch.Set(taskKey(k.p, k.id), enc, nil); err != nil {
			return nil, nil, nil, nil, err
		}
		var dig [8]byte
		binary.BigEndian.PutUint64(dig[:], res.NewDigest)
		if err := batch.Set(segmentKey(k.p, Segment(k.id), k.id), dig[:], nil); err != nil {
			return nil, nil, nil, nil, err
		}
		var oldMeta meta
		var oldSpec *crdt.Spec
		if old != nil {
			oldMeta = meta{state: old.Index, expiryMs: old.ExpiryMs}
			oldSpec = old.Task.Spec
		} else if !unseen[i] {
			if oldMeta, _, err = s.getMeta(k.p, k.id); err != nil {
				return nil, nil, nil, nil, err
			}
		}
		if err := moveTerminalKey(batch, k.p, k.id, old, out); err != nil {
			return nil, nil, nil, nil, err
		}
		newMeta := placeAfterMerge(oldMeta, oldSpec, out, now)
		ins, err := s.moveIndex(batch, k.p, k.id, oldMeta, oldSpec, newMeta, out.Spec)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		changes = append(changes, ins...)
	}
	results := make([]MergeResult, len(items))
	for i, it := range items {
		results[i] = byKey[key{it.Partition, it.Task.ID}]
	}
	return results, batch, changes, digests, nil
}

// terminalKey is the retention index key of a terminal task: the wall time
// of its deciding terminal event, then its id. nil when not terminal.
func terminalKey(p uint16, t *crdt.Task) []byte {
	ev, ok := t.Terminal()
	if !ok {
		return nil
	}
	return timeIDKey(p, tagTerminal, ev.At.WallMs, t.ID)
}

// moveTerminalKey keeps the retention index in step with a merge (an
// earlier terminal event arriving later moves the key).
func moveTerminalKey(b *pebble.Batch, p uint16, id uint64, old *StoredTask, out *crdt.Task) error {
	var oldKey []byte
	if old != nil {
		oldKey = terminalKey(p, old.Task)
	}
	newKey := terminalKey(p, out)
	if bytes.Equal(oldKey, newKey) {
		return nil
	}
	if oldKey != nil {
		if err := b.Delete(oldKey, nil); err != nil {
			return err
		}
	}
	if newKey != nil {
		return b.Set(newKey, nil, nil)
	}
	return nil
}

// TerminalBefore returns up to limit terminal tasks of partition p whose
// deciding terminal event is at or before ms, oldest first: the candidates
// for deletion after retention.
func (s *Store) TerminalBefore(p uint16, ms int64, limit int) ([]DueEntry, error) {
	return s.dueBefore(p, tagTerminal, ms, limit)
}

// DeleteTasks deletes tasks of partition p: their state, meta, index
// entries and segment entry, in one synced batch. The claim FSM's records
// are the FSM's to delete (through Raft). Missing ids are skipped.
func (s *Store) DeleteTasks(p uint16, ids []uint64) error {
	var digests []digestChange
	return s.commitMoves(p, ids, func(b *pebble.Batch) ([]readyChange, error) {
		var changes []readyChange
		for _, id := range ids {
			ti, err := s.loadIndex(p, id)
			if err != nil {
				return nil, err
			}
			if ti.task == nil && !ti.metaFound {
				continue
			}
			var spec *crdt.Spec
			if ti.task != nil {
				spec = ti.task.Spec
				digests = append(digests, digestChange{p: p, id: id, old: ti.digest, had: true})
				for _, k := range [][]byte{taskKey(p, id), segmentKey(p, Segment(id), id), terminalKey(p, ti.task)} {
					if k != nil {
						if err := b.Delete(k, nil); err != nil {
							return nil, err
						}
					}
				}
			}
			if k := indexKey(p, id, ti.m, spec); k != nil {
				if err := b.Delete(k, nil); err != nil {
					return nil, err
				}
				if ti.m.state == IndexReady {
					changes = append(changes, readyChange{p: p, queue: spec.Queue, key: k})
				}
			}
			if err := b.Delete(metaKey(p, id), nil); err != nil {
				return nil, err
			}
		}
		return changes, nil
	}, &digests)
}

// cloneNormalized returns t in canonical form without modifying the
// caller's slices.
func cloneNormalized(t *crdt.Task) *crdt.Task {
	c := &crdt.Task{ID: t.ID, Spec: t.Spec,
		Updates: slices.Clone(t.Updates), Terminals: slices.Clone(t.Terminals)}
	c.Normalize()
	return c
}

// placeAfterMerge decides the index state of a task after a merge. A
// claimed task stays claimed, terminal or not (the claimed index belongs to
// the claim FSM, which releases it); a terminal task or one without a spec
// is in no index; a task already ready or
// delayed stays so unless its spec changed (a resolved spec conflict); a
// task seen with a spec for the first time is delayed when its not-before
// time is after now, ready otherwise.
func placeAfterMerge(old meta, oldSpec *crdt.Spec, t *crdt.Task, nowMs int64) meta {
	if old.state == IndexClaimed {
		return old
	}
	if _, terminal := t.Terminal(); terminal || t.Spec == nil {
		return meta{state: IndexNone}
	}
	if old.state != IndexNone && sameIndexFields(oldSpec, t.Spec) {
		return old
	}
	return initialPlacement(t.Spec, nowMs)
}

// sameIndexFields reports whether two specs put a task at the same index
// keys.
func sameIndexFields(a, b *crdt.Spec) bool {
	return a != nil && b != nil && a.Queue == b.Queue && a.Priority == b.Priority && a.NotBeforeMs == b.NotBeforeMs
}

func initialPlacement(spec *crdt.Spec, nowMs int64) meta {
	if spec.NotBeforeMs > nowMs {
		return meta{state: IndexDelayed}
	}
	return meta{state: IndexReady}
}

// readyChange records a ready-index key written or deleted by a batch, so
// the queue's head cache can follow once the batch is visible.
type readyChange struct {
	p      uint16
	queue  string
	key    []byte
	insert bool // false: deleted
}

// moveIndex writes into b the new meta value and the index changes from
// (old, oldSpec) to (new, newSpec). It returns the ready-index changes.
func (s *Store) moveIndex(b *pebble.Batch, p uint16, id uint64, old meta, oldSpec *crdt.Spec, new meta, newSpec *crdt.Spec) ([]readyChange, error) {
	oldKey, newKey := indexKey(p, id, old, oldSpec), indexKey(p, id, new, newSpec)
	// Every write of a task (prepareMerge) or a meta comes here: raise the
	// horizon before the batch is applied. A meta can be written for a
	// task not stored here (a claim recorded first).
	if err := s.horizons.note(p, id); err != nil {
		return nil, err
	}
	if err := b.Set(metaKey(p, id), new.encode(), nil); err != nil {
		return nil, err
	}
	return moveIndexKeys(b, p, old, oldSpec, oldKey, new, newSpec, newKey)
}

// moveIndexKeys replaces oldKey by newKey in the indexes, and returns the
// ready-index changes.
func moveIndexKeys(b *pebble.Batch, p uint16, old meta, oldSpec *crdt.Spec, oldKey []byte, new meta, newSpec *crdt.Spec, newKey []byte) ([]readyChange, error) {
	if bytes.Equal(oldKey, newKey) {
		return nil, nil
	}
	var changes []readyChange
	if oldKey != nil {
		if err := b.Delete(oldKey, nil); err != nil {
			return nil, err
		}
		if old.state == IndexReady {
			changes = append(changes, readyChange{p: p, queue: oldSpec.Queue, key: oldKey})
		}
	}
	if newKey != nil {
		if err := b.Set(newKey, nil, nil); err != nil {
			return nil, err
		}
		if new.state == IndexReady {
			changes = append(changes, readyChange{p: p, queue: newSpec.Queue, key: newKey, insert: true})
		}
	}
	return changes, nil
}

// indexKey returns the index key of a task in state m, or nil for IndexNone.
func indexKey(p uint16, id uint64, m meta, spec *crdt.Spec) []byte {
	switch m.state {
	case IndexReady:
		return readyKey(p, spec.Queue, spec.Priority, id)
	case IndexDelayed:
		return timeIDKey(p, tagDelayed, spec.NotBeforeMs, id)
	case IndexClaimed:
		return timeIDKey(p, tagClaimed, m.expiryMs, id)
	}
	return nil
}

func stripeOf(id uint64) int { return int((id * 0x9E3779B97F4A7C15) >> (64 - 10)) }

// GetTask returns the state of id in partition p with its digest and index
// state, or ErrNotFound.
func (s *Store) GetTask(p uint16, id uint64) (*StoredTask, error) {
	return s.getTask(p, id)
}

// TaskState returns only the CRDT state of id in partition p, or
// ErrNotFound: one point read, for callers that need neither the digest
// nor the index state (the node's request paths).
func (s *Store) TaskState(p uint16, id uint64) (*crdt.Task, error) {
	enc, err := s.get(taskKey(p, id))
	if err != nil {
		return nil, err
	}
	return decodeTaskState(taskKey(p, id), id, enc)
}

func decodeTaskState(key []byte, id uint64, enc []byte) (*crdt.Task, error) {
	t, err := crdt.Decode(enc)
	if err != nil {
		return nil, corrupt(key, "%v", err)
	}
	if t.ID != id {
		return nil, corrupt(key, "stored task has id %d", t.ID)
	}
	return t, nil
}

func (s *Store) getTask(p uint16, id uint64) (*StoredTask, error) {
	key := taskKey(p, id)
	enc, err := s.get(key)
	if err != nil {
		return nil, err
	}
	st, err := decodeTask(p, key, enc)
	if err != nil {
		return nil, err
	}
	m, found, err := s.getMeta(p, id)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, corrupt(metaKey(p, id), "missing meta of a stored task")
	}
	st.Index, st.ExpiryMs = m.state, m.expiryMs
	return st, nil
}

// getMeta returns the meta of id. A claim can be recorded (by the claim FSM)
// before the task's state reaches this replica, so meta may exist without a
// task; a task never exists without meta.
func (s *Store) getMeta(p uint16, id uint64) (m meta, found bool, err error) {
	mv, err := s.get(metaKey(p, id))
	switch {
	case errors.Is(err, ErrNotFound):
		return meta{}, false, nil
	case err != nil:
		return meta{}, false, err
	}
	m, ok := decodeMeta(mv)
	if !ok {
		return meta{}, false, corrupt(metaKey(p, id), "bad meta value %x", mv)
	}
	return m, true, nil
}

// decodeTask decodes the task stored at key, without its index state.
func decodeTask(p uint16, key, enc []byte) (*StoredTask, error) {
	if len(key) != len(taskKey(p, 0)) {
		return nil, corrupt(key, "bad task key")
	}
	t, err := decodeTaskState(key, idFromKey(key), enc)
	if err != nil {
		return nil, err
	}
	return &StoredTask{Partition: p, Task: t, Digest: crdt.Digest(enc)}, nil
}

// get returns a copy of the value at key, or ErrNotFound.
func (s *Store) get(key []byte) ([]byte, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("storage: get %x: %w", key, err)
	}
	out := bytes.Clone(v)
	if out == nil {
		out = []byte{}
	}
	closer.Close()
	return out, nil
}

func corrupt(key []byte, format string, args ...any) error {
	return fmt.Errorf("%w: key %x: %s", ErrCorrupt, key, fmt.Sprintf(format, args...))
}

// ScanTasks returns up to limit tasks of partition p with id >= start, in id
// order, without their index state (Index is IndexNone). next is the id to
// pass as start for the following page; more is false on the last page.
func (s *Store) ScanTasks(p uint16, start uint64, limit int) (tasks []*StoredTask, next uint64, more bool, err error) {
	if limit <= 0 {
		return nil, 0, false, fmt.Errorf("storage: ScanTasks limit %d must be positive", limit)
	}
	_, end := tagSpan(p, tagTask)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: taskKey(p, start), UpperBound: end})
	if err != nil {
		return nil, 0, false, err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if len(tasks) == limit {
			return tasks, idFromKey(it.Key()), true, nil
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, 0, false, err
		}
		st, err := decodeTask(p, it.Key(), v)
		if err != nil {
			return nil, 0, false, err
		}
		tasks = append(tasks, st)
	}
	return tasks, 0, false, it.Error()
}

func idFromKey(k []byte) uint64 { return binary.BigEndian.Uint64(k[len(k)-8:]) }

// DropPartition deletes every key of partition p (tasks, indexes, Raft log
// and claim state) with one range delete, synced. The caller must have
// stopped everything that writes to p first, and its digest sink
// (UntrackDigests). Task merges of p already published come before the
// delete; later ones fail with ErrPartitionDropped until ReopenPartition.
func (s *Store) DropPartition(p uint16) error {
	s.dropMu.Lock()
	defer s.dropMu.Unlock()
	if s.dropped == nil {
		s.dropped = map[uint16]bool{}
	}
	s.dropped[p] = true
	start, end := partitionSpan(p)
	if err := s.db.DeleteRange(start, end, pebble.Sync); err != nil {
		return fmt.Errorf("storage: drop partition %d: %w", p, err)
	}
	s.headsMu.Lock()
	for k := range s.heads {
		if k.p == p {
			delete(s.heads, k)
		}
	}
	s.headsMu.Unlock()
	return nil
}

// ReopenPartition lets task merges of a dropped partition p in again (the
// node replicates it anew).
func (s *Store) ReopenPartition(p uint16) {
	s.dropMu.Lock()
	defer s.dropMu.Unlock()
	delete(s.dropped, p)
}

// SegmentEntry is one (id, digest) pair of the anti-entropy segment index.
type SegmentEntry struct {
	ID     uint64
	Digest uint64
}

// ScanSegments calls fn for every segment index entry of partition p with
// segment in [lo, hi), in (segment, id) order. fn's error stops the scan and
// is returned.
func (s *Store) ScanSegments(p uint16, lo, hi uint32, fn func(seg uint16, e SegmentEntry) error) error {
	start := binary.BigEndian.AppendUint16(partitionPrefix(p, tagSegment), uint16(min(lo, 1<<16-1)))
	end := partitionPrefix(p, tagSegment+1)
	if hi < 1<<16 {
		end = binary.BigEndian.AppendUint16(partitionPrefix(p, tagSegment), uint16(hi))
	}
	if lo >= hi {
		return nil
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if len(k) != 3+2+8 || len(v) != 8 {
			return corrupt(k, "bad segment index entry (value %x)", v)
		}
		seg := binary.BigEndian.Uint16(k[3:5])
		if err := fn(seg, SegmentEntry{ID: idFromKey(k), Digest: binary.BigEndian.Uint64(v)}); err != nil {
			return err
		}
	}
	return it.Error()
}

// quietLogger drops Pebble's informational messages and keeps errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	pebble.DefaultLogger.Errorf(format, args...)
}
func (quietLogger) Fatalf(format string, args ...any) {
	pebble.DefaultLogger.Fatalf(format, args...)
}
