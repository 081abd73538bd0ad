package rebalance

import (
	"fmt"
	"slices"

	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/replicas"
)

// removeEmptied removes from the ring every leaving or dead node that
// holds no replica and is named by no pending move, then from the meta
// group, and fills the meta group up to its size from the members.
func (d *Driver) removeEmptied() error {
	var gone []string
	_, err := d.editRing(func(r *cluster.Ring) (bool, error) {
		gone = gone[:0]
		keep := r.Nodes[:0:0]
		for _, nd := range r.Nodes {
			if (nd.Role == cluster.RoleLeaving || nd.Role == cluster.RoleDead) && r.Holds(nd.ID) == 0 && !r.Pending(nd.ID) {
				gone = append(gone, nd.ID)
				continue
			}
			keep = append(keep, nd)
		}
		if len(gone) == 0 || len(keep) < r.Replication {
			return false, nil
		}
		r.Nodes = keep
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, id := range gone {
		d.cfg.Logger.Info("node removed from the cluster", "node", id)
	}
	return d.fitMetaGroup()
}

// fitMetaGroup makes the meta group's voters the ring's nodes it should
// have: voters no longer in the ring are removed, and members (alive,
// role member first) are added until the group has MetaVoters of the
// ring's size. The leader removes itself last.
func (d *Driver) fitMetaGroup() error {
	d.metaFitMu.Lock()
	defer d.metaFitMu.Unlock()
	r := d.host.Meta().Ring()
	if r == nil || !d.host.Meta().IsLeader() {
		return nil
	}
	voters, err := d.host.Meta().Voters()
	if err != nil {
		return err
	}
	self := d.cfg.NodeID
	var kept []string
	var removeSelf bool
	for _, v := range voters {
		nd, ok := r.Node(v)
		if ok && nd.Role != cluster.RoleLeaving && nd.Role != cluster.RoleDead {
			kept = append(kept, v)
			continue
		}
		if v == self {
			removeSelf = true
			continue
		}
		if err := d.host.Meta().RemoveServer(v, replicas.ProposeTimeout); err != nil {
			return fmt.Errorf("remove %s from the meta group: %w", v, err)
		}
		d.cfg.Logger.Info("node left the meta group", "node", v)
	}
	want := cluster.MetaVoters(len(r.Nodes))
	for _, nd := range r.Nodes {
		if len(kept) >= want {
			break
		}
		if slices.Contains(kept, nd.ID) || nd.Role != cluster.RoleMember || !d.host.Up(nd.ID) {
			continue
		}
		if err := d.host.Meta().AddVoter(nd, replicas.ProposeTimeout); err != nil {
			return fmt.Errorf("add %s to the meta group: %w", nd.ID, err)
		}
		kept = append(kept, nd.ID)
		d.cfg.Logger.Info("node joined the meta group", "node", nd.ID)
	}
	if removeSelf && len(kept) > 0 {
		return d.host.Meta().RemoveServer(self, replicas.ProposeTimeout)
	}
	return nil
}
