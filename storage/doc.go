// Package storage is a node's one Pebble database: the CRDT state of every
// task it replicates, the local indexes that make claims and expiry cheap,
// and every partition's Raft log and stable store. Most indexes live in
// memory, built from the stored keys: the anti-entropy segment index,
// (segment, id) -> digest, for the partitions anti-entropy tracks
// (TrackDigests; a digest is the hash of the stored encoding); and, built
// at Open from the task and meta keys (buildIndexes), the ready index (per
// partition and queue the ids of the ready tasks by priority, in sorted
// chunks: readyList) and the delayed and claimed indexes (per partition
// (time, id) in a B-tree: timeIndex). Two indexes are keys per task: the
// retention index of terminal tasks (per queue, in the order they ended:
// each queue is deleted at its own horizon, DeleteExpired), and the queue index (every task with
// a spec under its queue, in id order: ScanQueue lists a queue without
// reading other queues' tasks).
//
// # Keyspace
//
// Every key starts with the partition as 2 bytes big-endian and a tag byte,
// so a partition is one contiguous span (DropPartition is one range delete)
// and each index of a partition is a contiguous sub-span.
//
//	p 0x01 id                       -> canonical crdt.Task encoding
//	p 0x02 queue 0x00 ^prio' id     -> (empty)  ready index (format 3 and before; deleted on upgrade)
//	p 0x03 notBeforeMs id           -> (empty)  delayed index (format 4 and before; deleted on upgrade)
//	p 0x04 expiryMs id              -> (empty)  claimed index (format 4 and before; deleted on upgrade)
//	p 0x05 segment id               -> digest   (format 2 and before; deleted on upgrade)
//	p 0x06 id                       -> meta: index state [+ expiryMs (claimed) or a retry's backoff end (delayed)]
//	p 0x07 terminalMs id            -> (empty)  retention index (format 6 and before; rebuilt as 0x0b on upgrade)
//	p 0x08 queue 0x00 class         -> int64    task counter (Pebble merge: sums)
//	p 0x09 id                       -> (empty)  ready tasks with dependencies
//	p 0x0a queue 0x00 id            -> (empty)  queue index (format 6)
//	p 0x0b queue 0x00 terminalMs id -> (empty)  retention index of terminal tasks, per queue (format 7)
//	p 0x10 index                    -> raft log entry   (RaftStore)
//	p 0x11 key                      -> raft stable value (RaftStore)
//	p 0x12 0x00                     -> claim FSM applied Raft index
//	p 0x12 0x01 id                  -> claim FSM record (opaque to storage)
//
// Integers are big-endian and fixed width; times are Unix milliseconds
// clamped at zero. A task's
// segment is the top 16 bits of ring.HashID(id) (ring.Partition uses the low bits).
//
// # Index states
//
// Each task has one local index state (meta): none (no spec yet, or
// terminal), ready, delayed or claimed. The state is local bookkeeping: it is
// not replicated and not part of the digest. MergeTask places a task the
// first time its spec arrives (delayed when not_before is in the future,
// ready otherwise) and takes it out of the ready and delayed indexes when it
// becomes terminal. The claimed index belongs to the claim FSM: only
// ApplyClaimFSM (and its wrappers MarkClaimed, ReleaseClaims) moves tasks in
// and out of it, whether or not the task's state has reached this replica
// (a claim recorded first leaves a meta entry without a task), so every
// replica of a partition holds the same claimed index. The monitor promotes
// due delayed tasks with PromoteDelayed.
//
// A task's queue index key does not depend on its index state: it is
// written with the task's spec and deleted with the task. Neither it nor
// the meta key is part of what anti-entropy compares (the digests of the
// task keys).
//
// # Use
//
//	s, err := storage.Open(storage.Config{Dir: dir})
//	res, err := s.MergeTasks(items)         // one synced batch; then ack
//	head, err := s.ReadyHead(p, "emails", 8)
//	err = s.MarkClaimed(p, []storage.ClaimMark{{ID: id, ExpiryMs: exp}})
//	due, err := s.ClaimsExpiring(p, nowMs, 100)
//	page, next, more, err := s.ScanQueue(p, "emails", 0, 256)
//	rs := s.RaftStore(p)                    // raft.LogStore + raft.StableStore
//
// Every write is synced before the call returns. Read-modify-writes of one
// task are serialized by a striped lock, so concurrent merges never lose
// events. A stored value that does not decode yields an error wrapping
// ErrCorrupt that names the key; nothing in this package panics on stored
// bytes.
package storage
