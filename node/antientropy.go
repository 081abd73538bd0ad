package node

import (
	"github.com/norn-dev/norn/replicas"
)

// aeHost is antientropy.Host over the node's replicas.
type aeHost struct{ *replicas.Host }

func (h aeHost) Replicates(p uint16) bool { return h.Group(p) != nil }
