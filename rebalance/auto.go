package rebalance

import (
	"fmt"
	"time"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
)

// autoRebalance (AutoRebalance) plans and applies a placement change when
// no move is queued or under way and ring r has a member dead (as the
// driver saw) for AutoDeadAfter, which is removed as by Remove with dead,
// or else a live member that holds nothing (it joined), which a rebalance
// gives replicas to. It looks at most every autoInterval.
func (d *Driver) autoRebalance(r *cluster.Ring) {
	if time.Since(d.autoAt) < autoInterval {
		return
	}
	d.autoAt = time.Now()
	for _, m := range r.Moves {
		if !m.State.Ended() {
			return
		}
	}
	name, role, why := "", "", ""
	for _, nd := range r.Nodes {
		if nd.Role != cluster.RoleMember && nd.Role != cluster.RoleDraining {
			continue
		}
		if down := d.downFor(nd.ID); down >= d.cfg.AutoDeadAfter {
			name, role, why = nd.ID, cluster.RoleDead, fmt.Sprintf("%s dead for %s", nd.ID, down.Round(time.Second))
			break
		}
		if why == "" && nd.Role == cluster.RoleMember && r.Holds(nd.ID) == 0 && d.host.Up(nd.ID) {
			why = nd.ID + " holds nothing"
		}
	}
	if why == "" {
		return
	}
	plan, err := d.Plan(name, role, true)
	if err != nil {
		if msg := apierr.Message(err); msg != d.autoErr {
			d.autoErr = msg
			d.cfg.Logger.Warn("auto rebalance failed", "why", why, "err", msg)
		}
		return
	}
	d.autoErr = ""
	if len(plan.GetMoves()) > 0 || role != "" {
		d.cfg.Logger.Info("auto rebalance", "why", why, "moves", len(plan.GetMoves()), "epoch", plan.GetRingEpoch())
	}
}
