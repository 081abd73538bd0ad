package node

import (
	"github.com/norn-dev/norn/replicas"
)

// aeHost is antientropy.Host over the node's replicas. A peer this node
// may not exchange task states with (mayExchange: the rejoin rule, or the
// test hook RefuseTaskStates) counts as down: no round, no fill.
type aeHost struct {
	*replicas.Host
	mayExchange func(peer string) error
}

func (h aeHost) Up(id string) bool { return h.Host.Up(id) && h.mayExchange(id) == nil }

func (h aeHost) Replicates(p uint16) bool { return h.Group(p) != nil }
