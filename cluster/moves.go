package cluster

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/norn-dev/norn/ring"
)

// Node roles in the ring (RingNode.Role). Only members receive replicas
// when a placement is planned.
const (
	RoleMember   = ""         // holds replicas as planned
	RoleDraining = "draining" // its replicas are moved off; it stays a member
	RoleLeaving  = "leaving"  // decommissioned: removed once it holds nothing
	RoleDead     = "dead"     // gone for good: its replicas are made again from the others
)

// RoleName is the role as operators read it ("member" for RoleMember).
func RoleName(role string) string {
	if role == RoleMember {
		return "member"
	}
	return role
}

// MoveState is where a replica move stands. A move goes queued -> filling
// -> catching-up -> promoted -> done. Before it is promoted it can be
// rolled back (cancelled, or its target down too long): filling or
// catching-up -> rolling-back -> failed; a queued move that cannot start
// or is cancelled fails at once. A promoted move always finishes.
type MoveState string

// The states of a move.
const (
	// MoveQueued: planned, waiting for the throttle.
	MoveQueued MoveState = "queued"
	// MoveFilling: the ring names To as a replica: coordinators write to
	// the cohort and To, To opens its replica and anti-entropy fills it.
	MoveFilling MoveState = "filling"
	// MoveCatchingUp: To is a non-voter of the partition's Raft group,
	// catching up on its log.
	MoveCatchingUp MoveState = "catching-up"
	// MovePromoted: To votes; From is being removed from the group (after
	// handing the leadership over if it led).
	MovePromoted MoveState = "promoted"
	// MoveDone: the cohort has To instead of From, whose replica is
	// dropped.
	MoveDone MoveState = "done"
	// MoveRollingBack: given up before promotion (Rollback says why);
	// To is being removed from the partition's Raft group. Writes still
	// go to To until the move has failed.
	MoveRollingBack MoveState = "rolling-back"
	// MoveFailed: given up and rolled back (Error says why): the cohort
	// is the old one, To's replica is dropped.
	MoveFailed MoveState = "failed"
)

// Active reports whether the move is under way: To has a replica and
// From has not handed its own over yet.
func (s MoveState) Active() bool {
	return s == MoveFilling || s == MoveCatchingUp || s == MovePromoted || s == MoveRollingBack
}

// CanRollBack reports whether a move in this state can still be rolled
// back: To does not vote yet (as the ring records it).
func (s MoveState) CanRollBack() bool { return s == MoveFilling || s == MoveCatchingUp }

// Ended reports whether the move is done or failed.
func (s MoveState) Ended() bool { return s == MoveDone || s == MoveFailed }

// Move is one replica move of a rebalance as the ring records it: From
// hands its replica of Partition over to To (the epoch handoff).
type Move struct {
	Partition int       `json:"partition"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	State     MoveState `json:"state"`
	// Epoch is the ring epoch at which the move started filling: from it
	// on, writes of the partition go to To as well, and a replica refuses
	// writes from a coordinator whose ring is older.
	Epoch uint64 `json:"epoch,omitempty"`
	// Error is the last error of the current step (retried), or why the
	// move failed.
	Error string `json:"error,omitempty"`
	// Rollback is why the move is rolled back (state rolling-back).
	Rollback string `json:"rollback,omitempty"`
}

// RollBack starts rolling partition p's move under way back, for why,
// when it is not promoted yet; it reports whether it did.
func (r *Ring) RollBack(p int, why string) bool {
	m := r.ActiveMove(p)
	if m == nil || !m.State.CanRollBack() {
		return false
	}
	m.State, m.Rollback, m.Error = MoveRollingBack, why, ""
	return true
}

// CancelMoves gives up every move not promoted yet, for why: queued moves
// fail, filling and catching-up moves roll back. Promoted moves finish.
// It returns how many moves it cancelled.
func (r *Ring) CancelMoves(why string) int {
	n := 0
	for i := range r.Moves {
		m := &r.Moves[i]
		switch {
		case m.State == MoveQueued:
			m.State, m.Error = MoveFailed, why
			n++
		case m.State.CanRollBack():
			m.State, m.Rollback, m.Error = MoveRollingBack, why, ""
			n++
		}
	}
	return n
}

// FailRollback records the end of partition p's rollback: the move
// failed, its cohort unchanged.
func (r *Ring) FailRollback(p int) error {
	m := r.ActiveMove(p)
	if m == nil || m.State != MoveRollingBack {
		return fmt.Errorf("cluster: partition %d has no move rolling back", p)
	}
	m.State, m.Error = MoveFailed, "rolled back: "+m.Rollback
	return nil
}

// ActiveMove returns partition p's move under way, nil when none.
func (r *Ring) ActiveMove(p int) *Move {
	for i := range r.Moves {
		if m := &r.Moves[i]; m.Partition == p && m.State.Active() {
			return m
		}
	}
	return nil
}

// MovesUnderway returns the moves under way by partition, nil when there
// is none.
func (r *Ring) MovesUnderway() map[int]*Move {
	var out map[int]*Move
	for i := range r.Moves {
		if m := &r.Moves[i]; m.State.Active() {
			if out == nil {
				out = map[int]*Move{}
			}
			out[m.Partition] = m
		}
	}
	return out
}

// Replicas returns the nodes holding a replica of partition p: its cohort
// and, while a move is under way, the move's target. Writes go to all of
// them. The slice is fresh.
func (r *Ring) Replicas(p int) []ring.NodeID {
	out := slices.Clone(r.Placement.Cohorts[p])
	if m := r.ActiveMove(p); m != nil && !slices.Contains(out, ring.NodeID(m.To)) {
		out = append(out, ring.NodeID(m.To))
	}
	return out
}

// NextCohort returns partition p's cohort once its move under way is
// done (its cohort when none). The slice is fresh.
func (r *Ring) NextCohort(p int) []ring.NodeID {
	out := slices.Clone(r.Placement.Cohorts[p])
	if m := r.ActiveMove(p); m != nil {
		if i := slices.Index(out, ring.NodeID(m.From)); i >= 0 {
			out[i] = ring.NodeID(m.To)
		}
	}
	return out
}

// HostsReplica reports whether node id holds a replica of partition p
// (Replicas).
func (r *Ring) HostsReplica(p int, id string) bool {
	if r.Hosts(p, id) {
		return true
	}
	m := r.ActiveMove(p)
	return m != nil && m.To == id
}

// Role returns node id's role, and whether the ring has the node.
func (r *Ring) Role(id string) (string, bool) {
	nd, ok := r.Node(id)
	return nd.Role, ok
}

// Clone returns a deep copy of r.
func (r *Ring) Clone() *Ring {
	c := *r
	c.Nodes = slices.Clone(r.Nodes)
	c.Placement = r.Placement.Clone()
	c.Moves = slices.Clone(r.Moves)
	c.CohortEpochs = slices.Clone(r.CohortEpochs)
	return &c
}

// Next returns a copy of r with the next epoch, to be changed and
// proposed.
func (r *Ring) Next() *Ring {
	c := r.Clone()
	c.Epoch++
	return c
}

// validateMoves checks the moves: known partitions and nodes, at most one
// move under way per partition, From in the cohort and To not in it while
// it is under way.
func (r *Ring) validateMoves() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadRing, fmt.Sprintf(format, args...))
	}
	active := map[int]bool{}
	for i, m := range r.Moves {
		if m.Partition < 0 || m.Partition >= r.Partitions {
			return bad("move %d: partition %d out of range", i, m.Partition)
		}
		if m.From == "" || m.To == "" || m.From == m.To {
			return bad("move %d of partition %d: from %q to %q", i, m.Partition, m.From, m.To)
		}
		switch m.State {
		case MoveQueued, MoveFilling, MoveCatchingUp, MovePromoted, MoveRollingBack, MoveDone, MoveFailed:
		default:
			return bad("move %d of partition %d: unknown state %q", i, m.Partition, m.State)
		}
		if !m.State.Active() {
			continue
		}
		if active[m.Partition] {
			return bad("partition %d has two moves under way", m.Partition)
		}
		active[m.Partition] = true
		if _, ok := r.Node(m.To); !ok {
			return bad("move of partition %d to unknown node %q", m.Partition, m.To)
		}
		if !r.Hosts(m.Partition, m.From) || r.Hosts(m.Partition, m.To) {
			return bad("move of partition %d from %s to %s does not match its cohort", m.Partition, m.From, m.To)
		}
		if m.Epoch == 0 || m.Epoch > r.Epoch {
			return bad("move of partition %d started at epoch %d (ring epoch %d)", m.Partition, m.Epoch, r.Epoch)
		}
	}
	return nil
}

// Errors of placement changes.
var (
	// ErrMovesUnderway refuses a new plan while moves of the last one are
	// under way.
	ErrMovesUnderway = errors.New("cluster: a rebalance is under way")
	// ErrUnknownNode is a node the ring (or gossip) does not know.
	ErrUnknownNode = errors.New("cluster: unknown node")
)

// PlanMoves plans the placement over the ring's members (role member) and
// returns the replica moves from the current placement to it, each
// queued. Moves not yet started (queued) are replaced; a plan is refused
// while moves are under way (ErrMovesUnderway).
func (r *Ring) PlanMoves() ([]Move, ring.Placement, error) {
	var busy []string
	for _, m := range r.Moves {
		if m.State.Active() {
			busy = append(busy, fmt.Sprintf("partition %d (%s -> %s, %s)", m.Partition, m.From, m.To, m.State))
		}
	}
	if len(busy) > 0 {
		return nil, ring.Placement{}, fmt.Errorf("%w: %d moves not finished: %s; wait for them (nornctl rebalance status)",
			ErrMovesUnderway, len(busy), strings.Join(busy, ", "))
	}
	var nodes []ring.Node
	for _, nd := range r.Nodes {
		if nd.Role == RoleMember {
			nodes = append(nodes, ring.Node{ID: ring.NodeID(nd.ID)})
		}
	}
	target, err := ring.Plan(r.Placement, nodes, r.Partitions, r.Replication)
	if err != nil {
		return nil, ring.Placement{}, err
	}
	var moves []Move
	for _, d := range ring.Diff(r.Placement, target) {
		if d.From == "" || d.To == "" {
			// The replication factor is fixed: every partition loses
			// as many members as it gains.
			return nil, ring.Placement{}, fmt.Errorf("cluster: plan adds or removes a replica of partition %d", d.Partition)
		}
		moves = append(moves, Move{Partition: d.Partition, From: string(d.From), To: string(d.To), State: MoveQueued})
	}
	return moves, target, nil
}

// Loads returns how many replicas the placement gives each node of the
// ring (0 for those it gives none).
func (r *Ring) Loads(pl ring.Placement) map[string]int {
	out := make(map[string]int, len(r.Nodes))
	for _, nd := range r.Nodes {
		out[nd.ID] = 0
	}
	for id, n := range pl.Loads() {
		out[string(id)] = n
	}
	return out
}

// FinishMove records the end of partition p's move under way: the cohort
// has To in place of From, the move is done, and the cohort changed at
// this ring's epoch (CohortEpochs): call it on the ring to be proposed
// (Next).
func (r *Ring) FinishMove(p int) error {
	m := r.ActiveMove(p)
	if m == nil {
		return fmt.Errorf("cluster: partition %d has no move under way", p)
	}
	c := r.Placement.Cohorts[p]
	i := slices.Index(c, ring.NodeID(m.From))
	if i < 0 {
		return fmt.Errorf("cluster: %s is not in partition %d's cohort", m.From, p)
	}
	c[i] = ring.NodeID(m.To)
	m.State, m.Error = MoveDone, ""
	if len(r.CohortEpochs) != r.Partitions {
		r.CohortEpochs = make([]uint64, r.Partitions)
	}
	r.CohortEpochs[p] = r.Epoch
	return nil
}

// Holds returns how many replicas node id has or is receiving: cohorts it
// is in plus moves under way to it.
func (r *Ring) Holds(id string) int {
	n := 0
	for p := range r.Partitions {
		if r.HostsReplica(p, id) {
			n++
		}
	}
	return n
}

// Pending reports whether node id is still named by a move not ended.
func (r *Ring) Pending(id string) bool {
	for _, m := range r.Moves {
		if !m.State.Ended() && (m.From == id || m.To == id) {
			return true
		}
	}
	return false
}
