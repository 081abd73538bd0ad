package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
)

// A node's incarnation names its data dir: a random id made when the dir's
// store is created (node's norn.json keeps it), gossiped (NodeMeta) and
// recorded in the ring (RingNode.Incarnation) when the node is one of the
// cluster's first nodes or joins. A node id names a seat in every Raft
// group the node belongs to, and Raft's safety rests on each seat's
// stable state: the term it voted in, its vote, the entries it
// acknowledged. A node whose data dir was lost (a replaced disk, rm -rf)
// and that starts again under its id comes back with none of that while
// the ring and every group's configuration still count it as a voter: it
// can vote a second time in a term it voted in (two leaders of one term),
// and it makes a majority with a node that lacks an entry it had
// acknowledged (a committed entry lost). Its new data dir has a new
// incarnation, which the ring does not know: CheckIncarnation refuses it
// before any of its Raft groups takes part (replicas.Host), and the node
// stops with the fix, which is to make it a new member.
//
// A ring from before incarnations records none (the field is empty):
// such a node is trusted as before, and the meta leader records the
// incarnation each node gossips the first time it sees it
// (IncarnationsToRecord, WithIncarnations). A data dir lost in that
// window is not detected.

// ErrDataDirReplaced is the refusal of a node whose data dir is not the
// one the ring knows under its id (ReplacedDataDirError says which).
var ErrDataDirReplaced = errors.New("cluster: the node's data dir is not the one the cluster knows under its id")

// ReplacedDataDirError is CheckIncarnation's refusal: it names the fix.
// It wraps ErrDataDirReplaced.
type ReplacedDataDirError struct {
	Node  string // the node's id
	Here  string // its data dir's incarnation
	Known string // the incarnation the ring records for the id
	Epoch uint64 // the ring's epoch
	Role  string // the id's role in the ring
}

func (e *ReplacedDataDirError) Error() string {
	id := e.Node
	msg := fmt.Sprintf("node %s: its data dir is not the one the cluster knows as %s (incarnation %s here, %s in the cluster's ring of epoch %d): "+
		"the data of %s was lost or replaced, and under its old id it would vote in its Raft groups without the votes and entries it had. ",
		id, id, e.Here, e.Known, e.Epoch, id)
	if e.Role == RoleDead || e.Role == RoleLeaving {
		return msg + fmt.Sprintf("%s is being removed from the cluster (role %s): once `nornctl status` shows it not a member, "+
			"start it again with an empty data dir; it joins as a new member (`nornctl join %s`, then `nornctl rebalance`). "+
			"Or start it now with an empty data dir under a new -node-id and join that", id, RoleName(e.Role), id)
	}
	return msg + fmt.Sprintf("Remove %s from the cluster (`nornctl remove %s --dead`, once gossip shows it dead; its replicas are made again from the others) "+
		"and start it again with an empty data dir: it joins as a new member (`nornctl join %s`, then `nornctl rebalance`). "+
		"Or start it with an empty data dir under a new -node-id, join that, then remove %s "+
		"(a cluster with no more members than replicas needs this way: the new member first)", id, id, id, id)
}

// Unwrap makes errors.Is(err, ErrDataDirReplaced) hold.
func (e *ReplacedDataDirError) Unwrap() error { return ErrDataDirReplaced }

// CheckIncarnation is the rule a node applies to every ring before it
// adopts it: r must not list id with another incarnation than this
// node's data dir has. A ring that does not list id (a node not yet
// joined, or removed: it joins as a new member), or lists it without an
// incarnation (a ring from before incarnations), passes; so does a nil
// ring. The refusal is a *ReplacedDataDirError.
func CheckIncarnation(r *Ring, id, incarnation string) error {
	if r == nil {
		return nil
	}
	nd, ok := r.Node(id)
	if !ok || nd.Incarnation == "" || nd.Incarnation == incarnation {
		return nil
	}
	return &ReplacedDataDirError{Node: id, Here: incarnation, Known: nd.Incarnation, Epoch: r.Epoch, Role: nd.Role}
}

// NewIncarnation returns a new random incarnation: 64 bits in 16 hex
// digits.
func NewIncarnation() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// IncarnationsToRecord is the meta leader's rule for rings from before
// incarnations: the incarnation of each node of r that records none,
// taken from its gossip once gossip sees it alive, of r's cluster (it
// has adopted a ring of this cluster, so it passed its own check) and
// gossiping one. Nil when there is nothing to record. Pure.
func IncarnationsToRecord(r *Ring, members []Member) map[string]string {
	if r == nil {
		return nil
	}
	var out map[string]string
	for _, m := range members {
		nd, ok := r.Node(m.ID)
		if !ok || nd.Incarnation != "" || m.Incarnation == "" || m.State != StateAlive || m.ClusterID != r.ClusterID {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[m.ID] = m.Incarnation
	}
	return out
}

// WithIncarnations returns the next ring (epoch + 1) with the given
// incarnations (by node id) recorded for the nodes that have none;
// nothing else changes.
func (r *Ring) WithIncarnations(incarnations map[string]string) *Ring {
	next := r.Next()
	for i := range next.Nodes {
		nd := &next.Nodes[i]
		if inc, ok := incarnations[nd.ID]; ok && nd.Incarnation == "" {
			nd.Incarnation = inc
		}
	}
	return next
}
