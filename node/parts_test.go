package node

import "github.com/norn-dev/norn/claims"

// Accessors the integration tests use to look inside a node's parts.

func (n *Node) partition(id uint64) uint16   { return n.host.Partition(id) }
func (n *Node) group(p uint16) *claims.Group { return n.host.Group(p) }
func (n *Node) groupList() []*claims.Group   { return n.host.Groups() }
