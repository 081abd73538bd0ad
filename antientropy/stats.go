package antientropy

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// Counters are the totals of a Scheduler's exchanges (the node's
// norn_antientropy_* metrics).
type Counters struct {
	Exchanges, Failures  uint64 // rounds and fills, and those that ended with an error
	Differing, Leaves    uint64 // partitions whose roots differed, differing leaves
	Pushed, Pulled       uint64 // task states sent and received
	BytesSent, BytesRecv uint64 // requests' and responses' bytes
}

// roundStats are a Scheduler's anti-entropy counters.
type roundStats struct {
	exchanges, failures  atomic.Uint64
	differing, leaves    atomic.Uint64
	pushed, pulled       atomic.Uint64
	bytesSent, bytesRecv atomic.Uint64

	mu        sync.Mutex
	converged map[uint16]time.Time // last exchange that found (or left) a partition's replicas equal

	// rounds numbers the exchanges this node starts; exchanged[p][peer]
	// is the number of the last one with peer that covered partition p
	// and completed (a move's target is filled once it exchanged with
	// the move's sources in a round that started after the ring named
	// it: ReplicaProgress).
	rounds    atomic.Uint64
	exchanged map[uint16]map[string]uint64
}

// completed records that round (with peer, over parts) completed.
func (s *roundStats) completed(round uint64, peer string, parts []uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exchanged == nil {
		s.exchanged = map[uint16]map[string]uint64{}
	}
	for _, p := range parts {
		m := s.exchanged[p]
		if m == nil {
			m = map[string]uint64{}
			s.exchanged[p] = m
		}
		m[peer] = max(m[peer], round)
	}
}

// filledFrom reports whether partition p was exchanged with every one of
// peers in a round numbered above after.
func (s *roundStats) filledFrom(p uint16, peers []string, after uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, peer := range peers {
		if s.exchanged[p][peer] <= after {
			return false
		}
	}
	return true
}

// forget drops partition p's exchange records (its replica is dropped).
func (s *roundStats) forget(p uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.exchanged, p)
}

func (s *roundStats) record(st Stats, err error, now time.Time) {
	s.exchanges.Add(1)
	if err != nil {
		s.failures.Add(1)
	}
	s.differing.Add(uint64(st.Differing))
	s.leaves.Add(uint64(st.Leaves))
	s.pushed.Add(uint64(st.Pushed))
	s.pulled.Add(uint64(st.Pulled))
	s.bytesSent.Add(uint64(st.BytesSent))
	s.bytesRecv.Add(uint64(st.BytesRecv))
	s.mu.Lock()
	if s.converged == nil {
		s.converged = map[uint16]time.Time{}
	}
	for _, p := range st.Converged {
		s.converged[p] = now
	}
	s.mu.Unlock()
}

// counters reads the counters.
func (s *roundStats) counters() Counters {
	return Counters{
		Exchanges: s.exchanges.Load(), Failures: s.failures.Load(),
		Differing: s.differing.Load(), Leaves: s.leaves.Load(),
		Pushed: s.pushed.Load(), Pulled: s.pulled.Load(),
		BytesSent: s.bytesSent.Load(), BytesRecv: s.bytesRecv.Load(),
	}
}

// convergedAt returns a copy of the last convergence per partition.
func (s *roundStats) convergedAt() map[uint16]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.converged)
}
