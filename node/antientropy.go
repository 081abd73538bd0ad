package node

import (
	"github.com/norn-dev/norn/replicas"
)

// aeHost is antientropy.Host over the node's replicas. A peer the
// rejoin rule keeps this node from exchanging task states with counts as
// down: no round, no fill.
type aeHost struct {
	*replicas.Host
	rejoin *rejoinGuard
}

func (h aeHost) Up(id string) bool { return h.Host.Up(id) && h.rejoin.mayExchange(id) == nil }

func (h aeHost) Replicates(p uint16) bool { return h.Group(p) != nil }
