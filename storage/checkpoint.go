package storage

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Checkpoint writes a consistent copy of the store into dir, which must
// not exist (its parent must): a Pebble database of every write committed
// before the call, which Open reads as it reads the store. Its sstables
// are hard links to the store's when dir is on the same filesystem
// (copies otherwise); the write-ahead log is flushed first and copied.
// It returns ErrClosed after Close.
func (s *Store) Checkpoint(dir string) error {
	if err := s.guard.enter(); err != nil {
		return err
	}
	defer s.guard.exit()
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("storage: checkpoint: %w", err)
	}
	return nil
}
