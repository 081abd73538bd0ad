package storage

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	// WALMinSyncInterval is the least time between two syncs of the WAL
	// (Pebble's option of that name): a synced commit that comes sooner
	// waits, and shares the sync with the commits arriving meanwhile. 0
	// syncs at once. Each fdatasync costs CPU (about a sixth of a node's
	// CPU went to it with 8 workers completing tasks one at a time);
	// 250 µs cut server CPU per task there by about 11%.
	WALMinSyncInterval time.Duration
	// TaskCacheRows bounds the tasks whose stored state and index state
	// are kept in memory (see rowCache). 0: 262,144; negative: none.
	TaskCacheRows int
	// Logger receives Pebble's log output; nil discards informational
	// messages and keeps errors on standard error.
	Logger pebble.Logger
	// Log receives the store's own messages: the progress of a format
	// upgrade at Open that reads every task. nil discards them.
	Log *slog.Logger
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
	// CountDrift is a seeded bug for the Jepsen harness (nornd -test-bug
	// count-drift), test-only: the task counters miss the claim FSM's
	// index moves. Never set it in production.
	CountDrift bool
	// RetentionFromEnqueue is a seeded bug for the Jepsen harness (nornd
	// -test-bug retention-from-enqueue), test-only: the retention index
	// keys a terminal task by its enqueue time instead of the time it
	// ended, so retention deletes it early. Never set it in production.
	RetentionFromEnqueue bool
}

// Validate reports a missing or out-of-range field.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return errors.New("storage: Config.Dir is required")
	}
	if c.CacheBytes < 0 {
		return errors.New("storage: Config.CacheBytes must not be negative")
	}
	if c.WALMinSyncInterval < 0 || c.WALMinSyncInterval > time.Second {
		return errors.New("storage: Config.WALMinSyncInterval must be between 0 and 1s")
	}
	return nil
}

// lockStripes is the number of per-id mutexes serializing read-modify-writes
// of one task.
const lockStripes = 1024

// Store is one node's Pebble database: task states, their local indexes and
// (through RaftStore) every partition's Raft log, with the anti-entropy
// segment index of the tracked partitions in memory. It is safe for concurrent use.
type Store struct {
	db      *pebble.DB
	guard   closeGuard // Close against RaftStore calls
	clock   crdt.Clock
	log     *slog.Logger                 // Config.Log
	onReady func(p uint16, queue string) // Config.OnReady
	noSync  bool                         // Config.AckBeforeSync (a seeded bug)
	drift   bool                         // Config.CountDrift (a seeded bug)
	early   bool                         // Config.RetentionFromEnqueue (a seeded bug)

	stripes [lockStripes]sync.Mutex

	// dropMu orders task merges (readers) before and after partition drops
	// (writer); dropped holds the partitions dropped and not reopened, whose
	// merges fail with ErrPartitionDropped.
	dropMu  sync.RWMutex
	dropped map[uint16]bool

	horizons       idHorizons // ids above which no task or meta is stored
	digests        digestSinks
	deleteHorizon  deleteHorizons
	recordHorizons idHorizons // ids above which no claim FSM record is stored

	rows     *rowCache      // nil when Config.TaskCacheRows < 0
	terminal terminalBounds // each queue's earliest retention key, per partition

	readyMu sync.RWMutex             // guards the maps of the in-memory indexes
	ready   map[queueKey]*readyQueue // the ready index
	times   map[dueKey]*timeIndex    // the delayed and claimed indexes
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
	fs := cfg.FS
	if fs == nil {
		fs = vfs.Default
	}
	opts := &pebble.Options{
		FS:     prewrittenWALs{fs},
		Cache:  cache,
		Logger: cfg.Logger,
		// 16 MiB memtables (Pebble's default is 4 MiB): small memtables
		// flush into many small L0 files that compactions then rewrite.
		// Measured with the 3-node enqueue benchmark when a replica wrote
		// about five keys per task (now two for an enqueue; not measured
		// again since): 4 MiB 6.7 s of CPU per 100k tasks, 16 MiB 5.8 s,
		// 32 MiB 6.7 s (deeper skiplists cost more than the saved
		// compactions). A new DB starts at 256 KiB and grows.
		MemTableSize: 16 << 20,
		// The task counters are merge operands (countMerger).
		Merger: countMerger,
	}
	if d := cfg.WALMinSyncInterval; d > 0 {
		opts.WALMinSyncInterval = func() time.Duration { return d }
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
	var rows *rowCache
	if cfg.TaskCacheRows >= 0 {
		rows = newRowCache(cmp.Or(cfg.TaskCacheRows, defaultRowCacheRows))
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Store{db: db, rows: rows, clock: cfg.Clock, log: cfg.Log, onReady: cfg.OnReady, noSync: cfg.AckBeforeSync, drift: cfg.CountDrift, early: cfg.RetentionFromEnqueue, ready: map[queueKey]*readyQueue{}, times: map[dueKey]*timeIndex{},
		horizons: idHorizons{db: db, spans: stateSpans}, recordHorizons: idHorizons{db: db, spans: recordSpans}}
	if err := s.upgrade(); err != nil {
		db.Close()
		return nil, err
	}
	for p, ok, err := s.nextPartition(0); ok || err != nil; p, ok, err = s.nextPartition(uint32(p) + 1) {
		if err == nil {
			err = s.buildIndexes(p)
		}
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("storage: building the indexes of partition %d: %w", p, err)
		}
	}
	return s, nil
}

// Close closes the database. RaftStores from RaftStore answer errors
// wrapping ErrClosed afterwards; other calls after Close fail or panic as
// Pebble does, so callers stop their users first.
func (s *Store) Close() error { return s.guard.close(s.db.Close) }

// RaftStore returns the raft.LogStore and raft.StableStore of partition p.
func (s *Store) RaftStore(p uint16) *RaftStore {
	rs := NewRaftStore(s.db, p)
	rs.guard = &s.guard
	return rs
}

func stripeOf(id uint64) int { return int((id * 0x9E3779B97F4A7C15) >> (64 - 10)) }

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
	s.rows.dropPartition(p)
	s.terminal.forget(p)
	s.dropIndexes(p)
	return nil
}

// ReopenPartition lets task merges of a dropped partition p in again (the
// node replicates it anew).
func (s *Store) ReopenPartition(p uint16) {
	s.dropMu.Lock()
	defer s.dropMu.Unlock()
	delete(s.dropped, p)
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
