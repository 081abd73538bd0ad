// Package faultfs is a Pebble vfs.FS for the Jepsen harness's power-loss
// fault (nornd -test-hooks): it wraps another vfs.FS (the OS filesystem)
// and keeps every file's unsynced writes in process memory.
//
// Write and WriteAt land in an in-memory overlay of the file; Sync,
// SyncData and a full SyncTo write the overlay's bytes to the underlying
// file and sync it. Reads (Read, ReadAt) and sizes (File.Stat, FS.Stat)
// see the overlay, so a process reads its own unsynced writes, as it would
// from the OS page cache. The overlay belongs to the file, not the handle:
// it outlives Close, follows Rename and Link, and is dropped by Remove.
// A process that exits without syncing (nornd's POST /test/crash) loses
// exactly the bytes a power loss would lose.
//
// Limitation: directory operations (Create, Rename, Remove, Link,
// MkdirAll, ReuseForWrite, the truncation of Create) go straight to the
// underlying filesystem and are durable at once, as if every directory
// were synced after each change; a power loss that loses a rename or a
// new file's directory entry is not modelled.
//
// Test-only: never use it in production.
package faultfs
