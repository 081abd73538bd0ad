package ring

import "errors"

// Errors returned by this package, always wrapped with context: test them
// with errors.Is.
var (
	// ErrBadPartitionCount: the partition count P is not a power of two in
	// [1, MaxPartitions].
	ErrBadPartitionCount = errors.New("bad partition count")

	// ErrBadReplication: the replication factor N is less than 1.
	ErrBadReplication = errors.New("bad replication factor")

	// ErrTooFewNodes: the replication factor N exceeds the number of nodes,
	// so a cohort of N distinct nodes cannot be formed.
	ErrTooFewNodes = errors.New("too few nodes")

	// ErrDuplicateNode: two nodes given to Plan share an id.
	ErrDuplicateNode = errors.New("duplicate node id")

	// ErrBadNode: a node given to Plan has an empty id or a negative weight.
	ErrBadNode = errors.New("bad node")

	// ErrPartitionMismatch: the current placement given to Plan has a
	// different partition count than requested. P is fixed at cluster
	// creation: changing it would move every task to another partition.
	ErrPartitionMismatch = errors.New("partition count mismatch")
)
