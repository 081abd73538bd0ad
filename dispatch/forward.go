package dispatch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/transport"
)

// Claims proxied to other leaders: the heads of theirs a claim took
// (claimRivals), and the claims of nodes that cannot report their heads
// (proxyClaim).

// proxyTimeout bounds a claim proxied to another node.
const proxyTimeout = 3 * time.Second

// proxyClaim asks the live nodes of only, in random order, for up to
// limit tasks from the partitions they lead, without a floor: the claim
// of nodes that cannot report their heads (an older version). It returns
// the nodes that answered, and stranded: a node's refusal because
// partitions of its own with ready tasks have no reachable leader. It
// returns an error only when no node answered.
func (d *Dispatcher) proxyClaim(ctx context.Context, m *nornv1.ClaimRequest, limit int, only map[string]bool) (out []*nornv1.ClaimedTask, answeredBy map[string]bool, stranded, err error) {
	r := d.host.Ring()
	alive := d.host.Alive()
	answeredBy = map[string]bool{}
	var lastErr error
	for _, i := range rand.Perm(len(r.Nodes)) {
		nd := r.Nodes[i]
		if !only[string(nd.ID)] || !alive[string(nd.ID)] || len(out) >= limit {
			continue
		}
		tasks, err := d.forwardClaim(ctx, nd.APIAddr, m, limit-len(out), nil, nil)
		if err != nil {
			if isStranded(err) {
				// It answered: what it leads had nothing, and some of
				// its other partitions have no reachable leader.
				answeredBy[string(nd.ID)] = true
				stranded = err
				continue
			}
			lastErr = err
			continue
		}
		answeredBy[string(nd.ID)] = true
		out = append(out, tasks...)
	}
	if len(answeredBy) == 0 {
		return out, answeredBy, stranded, noLeaderReachable(lastErr)
	}
	return out, answeredBy, stranded, nil
}

// forwardClaim asks the node at addr for up to n tasks of m's queue from
// the partitions it leads, none below floor when it is set, for m's
// worker and lease.
func (d *Dispatcher) forwardClaim(ctx context.Context, addr string, m *nornv1.ClaimRequest, n int, floor *int32, ids []uint64) ([]*nornv1.ClaimedTask, error) {
	req := transport.Forwarded(&nornv1.ClaimRequest{Queue: m.GetQueue(), Worker: m.GetWorker(), Lease: m.GetLease(), Max: uint32(n)}, 0)
	if floor != nil {
		req.Header().Set(transport.HeaderClaimFloor, strconv.Itoa(int(*floor)))
	}
	if len(ids) > 0 {
		req.Header().Set(transport.HeaderClaimIDs, transport.FormatIDs(ids))
	}
	ctx, cancel := context.WithTimeout(ctx, proxyTimeout)
	defer cancel()
	resp, err := d.peers.Get(addr).Tasks.Claim(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetTasks(), nil
}

// noLeaderReachable is a claim's answer when no other node answered it
// and this node leads nothing: UNAVAILABLE, with the last call's error.
func noLeaderReachable(lastErr error) error {
	why := "no other node is alive"
	if lastErr != nil {
		why = apierr.Message(lastErr)
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("no partition leader reachable: %s", why))
}

// claimRivals asks each other leader whose heads claimRound took for
// them (a proxied claim with the lowest priority taken as its floor; when
// pinned, naming them: the pick weighed fairness keys), at once; the
// returned function waits for the answers. short reports a leader that
// gave fewer than it reported.
func (d *Dispatcher) claimRivals(ctx context.Context, a claimArgs, rivals []*rival, pinned bool) func() (out []*nornv1.ClaimedTask, short bool) {
	type answer struct {
		rv    *rival
		tasks []*nornv1.ClaimedTask
		err   error
	}
	answers := make(chan answer, len(rivals))
	asked := 0
	for _, rv := range rivals {
		if len(rv.picks) == 0 {
			continue
		}
		asked++
		go func() {
			var ids []uint64
			if pinned {
				ids = rv.picks
			}
			tasks, err := d.forwardClaim(ctx, rv.addr, a.msg, len(rv.picks), &rv.floor, ids)
			answers <- answer{rv: rv, tasks: tasks, err: err}
		}()
	}
	return func() (out []*nornv1.ClaimedTask, short bool) {
		for range asked {
			an := <-answers
			d.remote.stats.forwarded.Add(1)
			if an.err != nil || len(an.tasks) < len(an.rv.picks) {
				d.remote.stats.forwardedShort.Add(1)
			}
			if an.err != nil && !isStranded(an.err) {
				d.remote.failed(a.msg.GetQueue(), an.rv, an.err)
				short = true
				continue
			}
			d.remote.took(a.msg.GetQueue(), an.rv, len(an.tasks))
			short = short || len(an.tasks) < len(an.rv.picks)
			out = append(out, an.tasks...)
		}
		return out, short
	}
}
