package storage

import "github.com/cockroachdb/pebble/v2"

// Metrics returns Pebble's metrics of the store's database (compactions,
// levels, memtables, block cache, WAL and its fsync latency), for the
// node's /metrics; ErrClosed after Close. The caller owns the result.
// It takes Pebble's locks briefly: call it per scrape, not per request.
func (s *Store) Metrics() (*pebble.Metrics, error) {
	if err := s.guard.enter(); err != nil {
		return nil, err
	}
	defer s.guard.exit()
	return s.db.Metrics(), nil
}
