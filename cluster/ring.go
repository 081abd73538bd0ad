package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/norn-dev/norn/ring"
)

// RingNode is one node of the cluster as the ring records it: where to
// reach it. Addresses are host:port.
type RingNode struct {
	ID         string `json:"id"`
	APIAddr    string `json:"api"`
	RaftAddr   string `json:"raft"`
	GossipAddr string `json:"gossip"`
	// Role is RoleMember (""), RoleDraining, RoleLeaving or RoleDead.
	Role string `json:"role,omitempty"`
	// Incarnation names the node's data dir (incarnation.go): recorded
	// when the node is one of the cluster's first or joins; empty in a
	// ring from before incarnations until the meta leader records it.
	Incarnation string `json:"incarnation,omitempty"`
}

// Ring is the cluster's authoritative layout, held by the meta Raft group
// and copied to every node (which keeps the last one it saw in its data
// dir): the cluster's identity, its nodes, P, N and the placement of every
// partition's cohort. Epoch grows by one with every change.
type Ring struct {
	ClusterID   string         `json:"cluster_id"`
	Epoch       uint64         `json:"epoch"`
	Partitions  int            `json:"partitions"`
	Replication int            `json:"replication"`
	Nodes       []RingNode     `json:"nodes"` // sorted by id
	Placement   ring.Placement `json:"placement"`
	// Moves are the replica moves of the current (or last) rebalance, in
	// plan order; ended ones stay until the next plan is applied.
	Moves []Move `json:"moves,omitempty"`
	// CohortEpochs holds, per partition, the epoch of the ring that last
	// changed its cohort (a finished move); 0 when it has not changed
	// since the cluster formed, or not since a version that kept no
	// record (the field is then absent: nil). A replica refuses writes of
	// the partition from a coordinator whose ring is older (coord's
	// checkEpoch), so a coordinator on a stale ring never counts acks of
	// a cohort that no longer owns it. Read it with CohortEpoch.
	CohortEpochs []uint64 `json:"cohort_epochs,omitempty"`
}

// CohortEpoch returns the epoch of the ring that last changed partition
// p's cohort (CohortEpochs), 0 when none is recorded.
func (r *Ring) CohortEpoch(p int) uint64 {
	if p < 0 || p >= len(r.CohortEpochs) {
		return 0
	}
	return r.CohortEpochs[p]
}

// Errors of Ring.Validate and the meta group.
var (
	// ErrBadRing is a ring that does not hold together (wrapped with the
	// reason).
	ErrBadRing = errors.New("cluster: invalid ring")
	// ErrStaleEpoch is a ring change proposed against an epoch that is no
	// longer the current one.
	ErrStaleEpoch = errors.New("cluster: ring epoch changed meanwhile")
	// ErrOtherCluster is a ring or peer of a different cluster.
	ErrOtherCluster = errors.New("cluster: belongs to another cluster")
)

// Validate checks the ring's shape: an id, P a valid partition count, every
// cohort N distinct known nodes.
func (r *Ring) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadRing, fmt.Sprintf(format, args...))
	}
	if r.ClusterID == "" {
		return bad("no cluster id")
	}
	if r.Epoch == 0 {
		return bad("epoch 0")
	}
	if err := ring.ValidatePartitions(r.Partitions); err != nil {
		return bad("%v", err)
	}
	if r.Replication < 1 || r.Replication > len(r.Nodes) {
		return bad("replication %d with %d nodes", r.Replication, len(r.Nodes))
	}
	known := make(map[string]bool, len(r.Nodes))
	for i, nd := range r.Nodes {
		// A cluster of one needs no API address in its ring (nothing
		// calls it); a node of a larger one does.
		if nd.ID == "" || nd.RaftAddr == "" || (nd.APIAddr == "" && len(r.Nodes) > 1) {
			return bad("node %d lacks an id or an address", i)
		}
		if i > 0 && r.Nodes[i-1].ID >= nd.ID {
			return bad("nodes not sorted by id or repeated at %q", nd.ID)
		}
		switch nd.Role {
		case RoleMember, RoleDraining, RoleLeaving, RoleDead:
		default:
			return bad("node %q has unknown role %q", nd.ID, nd.Role)
		}
		known[nd.ID] = true
	}
	if len(r.Placement.Cohorts) != r.Partitions {
		return bad("%d cohorts for %d partitions", len(r.Placement.Cohorts), r.Partitions)
	}
	for p, c := range r.Placement.Cohorts {
		if len(c) != r.Replication {
			return bad("partition %d has %d members, want %d", p, len(c), r.Replication)
		}
		for i, id := range c {
			if !known[string(id)] || slices.Contains(c[:i], id) {
				return bad("partition %d: member %q unknown or repeated", p, id)
			}
		}
	}
	if len(r.CohortEpochs) != 0 && len(r.CohortEpochs) != r.Partitions {
		return bad("%d cohort epochs for %d partitions", len(r.CohortEpochs), r.Partitions)
	}
	for p, e := range r.CohortEpochs {
		if e > r.Epoch {
			return bad("partition %d's cohort changed at epoch %d, after the ring's %d", p, e, r.Epoch)
		}
	}
	return r.validateMoves()
}

// Node returns the ring's node id.
func (r *Ring) Node(id string) (RingNode, bool) {
	i, ok := slices.BinarySearchFunc(r.Nodes, id, func(n RingNode, id string) int { return strings.Compare(n.ID, id) })
	if !ok {
		return RingNode{}, false
	}
	return r.Nodes[i], true
}

// Cohort returns partition p's members in placement order (the slice
// belongs to the ring: do not modify it).
func (r *Ring) Cohort(p int) []ring.NodeID { return r.Placement.Cohorts[p] }

// Hosts reports whether node id is in partition p's cohort.
func (r *Ring) Hosts(p int, id string) bool {
	return slices.Contains(r.Placement.Cohorts[p], ring.NodeID(id))
}

// NewRing plans the first ring of a new cluster over nodes: a fresh
// cluster id, epoch 1, p partitions of n replicas each.
func NewRing(nodes []RingNode, p, n int) (*Ring, error) {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b RingNode) int { return strings.Compare(a.ID, b.ID) })
	rn := make([]ring.Node, len(nodes))
	for i, nd := range nodes {
		rn[i] = ring.Node{ID: ring.NodeID(nd.ID)}
	}
	pl, err := ring.Plan(ring.Placement{}, rn, p, n)
	if err != nil {
		return nil, err
	}
	r := &Ring{ClusterID: hex.EncodeToString(id[:]), Epoch: 1, Partitions: p, Replication: n,
		Nodes: nodes, Placement: pl}
	return r, r.Validate()
}

// MetaVoters is how many nodes of a cluster of size nodes vote in the meta
// group: 3, or 5 once the cluster has 5 or more nodes (fewer on a smaller
// cluster).
func MetaVoters(nodes int) int {
	if nodes >= 5 {
		return 5
	}
	return min(nodes, 3)
}

// Formation is the decision of a node waiting to create a cluster of
// expect nodes, given the members gossip shows: whether enough are there,
// which ones form the cluster (the expect up members, alive or suspect,
// without a cluster id, lowest ids first) and whether this node is the one
// that bootstraps the meta group (the lowest id among them).
type Formation struct {
	Ready     bool
	Members   []Member // the cluster's first nodes, sorted by id
	Bootstrap bool     // this node creates the cluster
}

// DecideFormation is the pure rule every waiting node applies; all of them
// reach the same answer from the same member list, and only the lowest id
// acts on it. While gossip shows an up member of a cluster, nobody forms
// one: new nodes that reach a running cluster (a StatefulSet grown by
// three or more, all started with -bootstrap-expect) wait to be joined
// instead of forming a second cluster beside it, and meanwhile pull its
// ring (replicas.Host.reconcile).
func DecideFormation(members []Member, expect int, self string) Formation {
	var free []Member
	for _, m := range members {
		if !m.State.Up() {
			continue
		}
		if m.ClusterID != "" {
			return Formation{}
		}
		if m.APIAddr != "" && m.RaftAddr != "" {
			free = append(free, m)
		}
	}
	slices.SortFunc(free, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	if expect < 1 || len(free) < expect {
		return Formation{}
	}
	free = free[:expect]
	return Formation{Ready: true, Members: free, Bootstrap: free[0].ID == self}
}

// ringFile is where a node keeps the last ring it adopted, in its data
// dir.
const ringFile = "ring.json"

// LoadRing reads the ring kept in dir; (nil, nil) when there is none.
func LoadRing(dir string) (*Ring, error) {
	b, err := os.ReadFile(filepath.Join(dir, ringFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Ring
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", filepath.Join(dir, ringFile), err)
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", filepath.Join(dir, ringFile), err)
	}
	return &r, nil
}

// SaveRing writes r to dir atomically and durably (write a temporary
// file, fsync, rename, fsync the dir).
func SaveRing(dir string, r *Ring) error {
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	return writeDurably(dir, ringFile, b)
}

// writeDurably writes b to dir/name atomically and durably (write a
// temporary file, fsync, rename, fsync the dir).
func writeDurably(dir, name string, b []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp) // leave no half-written file behind
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
