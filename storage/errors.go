package storage

import "errors"

// ErrNotFound is returned when a task is not stored in the partition.
// Its text is what a client reads after NOT_FOUND (apierr.From passes it
// on), so it names no package.
var ErrNotFound = errors.New("task not found")

// ErrCorrupt is returned (wrapped) when a stored value cannot be decoded.
// The wrapping error names the key (hex). Test for it with errors.Is.
var ErrCorrupt = errors.New("storage: corrupt value")

// ErrStableKeyNotFound is returned, unwrapped, by RaftStore.Get and
// RaftStore.GetUint64 for a key that was never set. Its message is exactly
// "not found" because hashicorp/raft recognises a missing stable key by
// comparing err.Error() with that string (as raft-boltdb's ErrKeyNotFound
// does); never wrap it on a path that raft reads.
var ErrStableKeyNotFound = errors.New("not found")

// ErrPartitionDropped is returned (wrapped) by a task merge into a
// partition this store dropped (its replica was handed over).
var ErrPartitionDropped = errors.New("storage: partition dropped from this node")
