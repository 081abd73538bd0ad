package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// checkEpoch refuses a write of partition p from a caller whose ring
// (epoch) predates p's move under way (moving, the ring's moves under
// way): the caller would not write to the move's target, and the handoff
// could lose the write. The caller takes this node's ring and writes
// again.
func (n *Node) checkEpoch(epoch uint64, moving map[int]*cluster.Move, p uint16) error {
	if m := moving[int(p)]; m != nil && epoch < m.Epoch {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
			"partition %d is moving since ring epoch %d and %s (epoch %d); retry once it has the new ring",
			p, m.Epoch, staleRingRefusal, epoch))
	}
	return nil
}

// peerService implements norn.v1.PeerService.
type peerService struct{ n *Node }

var _ nornv1connect.PeerServiceHandler = peerService{}

// checkPeer refuses a call that does not come from a node of this
// node's cluster: unknown node id, an address that is not that node's, or
// another cluster id. Before the cluster is formed, gossip members are
// accepted (GetRing).
func (n *Node) checkPeer(peerAddr string, h http.Header) error {
	id := h.Get(transport.HeaderNode)
	deny := func(format string, args ...any) error {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("peer call refused: "+format, args...))
	}
	host, _, err := net.SplitHostPort(peerAddr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return deny("unknown caller address %q", peerAddr)
	}
	sameHost := func(hostport string) bool { return transport.SameHost(hostport, ip) }
	r := n.host.Ring()
	if r != nil {
		if c := h.Get(transport.HeaderCluster); c != "" && c != r.ClusterID {
			return deny("the caller is in cluster %s, this node in %s", c, r.ClusterID)
		}
		if nd, ok := r.Node(id); ok && sameHost(nd.APIAddr) {
			return nil
		}
	}
	for _, m := range n.host.Members().Members() {
		if m.ID == id && sameHost(m.APIAddr) && (r == nil || m.ClusterID == "" || m.ClusterID == r.ClusterID) {
			return nil
		}
	}
	return deny("%q at %s is not a member of this cluster", id, peerAddr)
}

// maxReplicate bounds the tasks of one Replicate call.
const maxReplicate = 10_000

func (s peerService) Replicate(_ context.Context, req *connect.Request[nornv1.ReplicateRequest]) (*connect.Response[nornv1.ReplicateResponse], error) {
	n := s.n
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	r := n.host.Ring()
	if r == nil {
		return nil, apierr.NotFormed
	}
	states := req.Msg.GetTasks()
	if len(states) == 0 || len(states) > maxReplicate {
		return nil, apierr.Invalid("tasks", "must hold 1 to %d tasks, got %d", maxReplicate, len(states))
	}
	// The caller's ring epoch: a newer one makes this node pull it.
	epoch, _ := strconv.ParseUint(req.Header().Get(transport.HeaderEpoch), 10, 64)
	if epoch > r.Epoch {
		n.host.KickReconcile()
	}
	moving := r.MovesUnderway()
	tasks := make([]*crdt.Task, len(states))
	for i, b := range states {
		t, err := crdt.Decode(b)
		if err != nil {
			return nil, apierr.Invalid(fmt.Sprintf("tasks[%d]", i), "%v", err)
		}
		if err := validateTask(t, n.cfg.Limits); err != nil {
			return nil, apierr.Invalid(fmt.Sprintf("tasks[%d]", i), "%v", err)
		}
		p := n.host.Partition(t.ID)
		if n.host.Group(p) == nil {
			// The caller's ring and this node's disagree (a partition
			// moves): retryable, and the caller's next ring will tell.
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf(
				"tasks[%d]: partition %d is not replicated on %s (ring epoch %d)", i, p, n.cfg.NodeID, r.Epoch))
		}
		if err := n.checkEpoch(epoch, moving, p); err != nil {
			return nil, err
		}
		tasks[i] = t
	}
	if n.cfg.TestBugs.DropReplicatedWrite && n.replicatesIn.Add(1)%dropReplicateEvery == 0 {
		// The seeded bug: acknowledged, not stored.
		return connect.NewResponse(&nornv1.ReplicateResponse{}), nil
	}
	if err := n.mergeLocal(tasks); err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.ReplicateResponse{}), nil
}

// maxRead bounds the ids of one Read call.
const maxRead = 1000

func (s peerService) Read(_ context.Context, req *connect.Request[nornv1.ReadRequest]) (*connect.Response[nornv1.ReadResponse], error) {
	n := s.n
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	if n.host.Ring() == nil {
		return nil, apierr.NotFormed
	}
	ids := req.Msg.GetIds()
	if len(ids) == 0 || len(ids) > maxRead {
		return nil, apierr.Invalid("ids", "must hold 1 to %d ids, got %d", maxRead, len(ids))
	}
	out := make([]*nornv1.ReplicaTask, len(ids))
	for i, id := range ids {
		p := n.host.Partition(id)
		g := n.host.Group(p)
		if g == nil {
			return nil, n.notReplicated(fmt.Sprintf("ids[%d]", i), p)
		}
		rt := &nornv1.ReplicaTask{Leader: g.IsLeader()}
		t, err := n.store.TaskState(p, id)
		switch {
		case err == nil:
			rt.State = t.Encode()
		case !errors.Is(err, storage.ErrNotFound):
			return nil, apierr.From(err)
		}
		if rt.Leader {
			rec, err := n.store.ClaimFSMRecord(p, id)
			switch {
			case err == nil:
				rt.ClaimRecord = rec
			case !errors.Is(err, storage.ErrNotFound):
				return nil, apierr.From(err)
			}
		}
		out[i] = rt
	}
	return connect.NewResponse(&nornv1.ReadResponse{Tasks: out}), nil
}

func (s peerService) GetRing(_ context.Context, req *connect.Request[nornv1.GetRingRequest]) (*connect.Response[nornv1.GetRingResponse], error) {
	n := s.n
	if err := n.checkPeer(req.Peer().Addr, req.Header()); err != nil {
		return nil, err
	}
	resp := &nornv1.GetRingResponse{}
	if r := n.host.Ring(); r != nil {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		resp.Ring = b
	}
	return connect.NewResponse(resp), nil
}

// decodeRecord decodes a claim record sent by a peer (nil when empty).
func decodeRecord(b []byte) (*claims.Record, error) {
	if len(b) == 0 {
		return nil, nil
	}
	return claims.DecodeRecord(b)
}
