package dispatch

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/ring"
)

// strandedMarker starts the message of a claim's refusal because
// partitions holding ready tasks have no reachable leader; a node that
// proxies a claim recognises another node's refusal by it.
const strandedMarker = "no reachable leader for partitions holding ready tasks"

// stranded returns the partitions replicated here whose ready index holds
// tasks of queue while no leader of theirs can be reached: none is known
// (an election), the group is not open yet, or its leader is another node
// that did not answer this claim (answered: the nodes that did; for a
// claim proxied here, the live nodes, which the forwarding node asks
// itself). Partitions this node leads are not stranded: the claim just
// looked at them.
//
// The ready index of a follower follows the claim FSM's applied entries,
// so a task it shows may have been claimed at a leader it cannot hear
// from: stranded is "may hold claimable tasks", which is what a worker
// needs to tell an unreachable queue from an empty one.
func (d *Dispatcher) stranded(queue string, answered map[string]bool, proxied bool) []uint16 {
	r := d.host.Ring()
	if r == nil {
		return nil
	}
	groups := d.host.Groups()
	var alive map[string]bool
	if proxied {
		alive = d.host.Alive()
	}
	var out []uint16
	for p := range r.Partitions {
		if !slices.Contains(r.Replicas(p), ring.NodeID(d.cfg.NodeID)) {
			continue
		}
		leader := ""
		if p < len(groups) && groups[p] != nil {
			if groups[p].IsLeader() {
				continue
			}
			leader = string(groups[p].Leader())
		}
		switch {
		case leader == "" || leader == d.cfg.NodeID:
			// No leader known, or this node is leaving or entering the
			// leadership: nobody serves the partition's claims now.
		case proxied && alive[leader]:
			continue
		case !proxied && answered[leader]:
			continue
		}
		heads, err := d.store.ReadyHead(uint16(p), queue, 1)
		if err == nil && len(heads) > 0 {
			out = append(out, uint16(p))
		}
	}
	return out
}

// strandedError is a claim's answer when it found nothing to claim while
// partitions may hold ready tasks out of its reach: UNAVAILABLE, which a
// client retries, rather than an empty answer.
func strandedError(queue string, parts []uint16) error {
	shown := parts
	if len(shown) > 8 {
		shown = shown[:8]
	}
	more := ""
	if len(parts) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(parts)-len(shown))
	}
	return connect.NewError(connect.CodeUnavailable,
		fmt.Errorf("%s of queue %q: %v%s (a leader election or a node failure; retry)", strandedMarker, queue, shown, more))
}

// isStranded reports whether err is another node's strandedError.
func isStranded(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable && strings.HasPrefix(ce.Message(), strandedMarker)
}
