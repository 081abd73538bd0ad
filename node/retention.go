package node

import (
	"time"

	"github.com/norn-dev/norn/cluster"
)

// retentionCache is the queues' own retentions of one queue settings
// table (QueueSettings.retention), computed once per table: the monitor
// asks for them on every partition's retention pass.
type retentionCache struct {
	table    *cluster.Queues
	byQueue  map[string]time.Duration
	shortest time.Duration // 0: no queue has one
}

// retentions returns the cache of the current queue settings table.
func (n *Node) retentions() *retentionCache {
	q := n.host.Queues()
	if c := n.retention.Load(); c != nil && c.table == q {
		return c
	}
	c := &retentionCache{table: q}
	for _, name := range q.Names() {
		if ms := q.Get(name).RetentionMs; ms > 0 {
			if c.byQueue == nil {
				c.byQueue = map[string]time.Duration{}
			}
			r := time.Duration(ms) * time.Millisecond
			c.byQueue[name] = r
			if c.shortest == 0 || r < c.shortest {
				c.shortest = r
			}
		}
	}
	n.retention.Store(c)
	return c
}

// queueRetention is dispatch.Config.QueueRetention: the queues' own
// retentions and the version of the settings they come from.
func (n *Node) queueRetention() (map[string]time.Duration, uint64) {
	c := n.retentions()
	return c.byQueue, c.table.VersionOf()
}

// shortestQueueRetention is the shortest retention a queue has of its
// own (0: none), which bounds how long a node may be out of the cluster
// (rejoin.go).
func (n *Node) shortestQueueRetention() time.Duration { return n.retentions().shortest }
