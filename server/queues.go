package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/coord"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/rebalance"
	"github.com/norn-dev/norn/replicas"
	"github.com/norn-dev/norn/transport"
)

// QueueService (docs/JOBQUEUE.md "Queues"): a queue's settings live in
// the meta group (cluster.Queues). SetQueue runs on the meta leader
// (rebalance.ToMetaLeader), which proposes the change and pushes the new
// table to every live node before it answers; reads answer from this
// node's table and counts.

// queueService implements norn.v1.QueueService.
type queueService struct{ sv *Server }

var _ nornv1connect.QueueServiceHandler = queueService{}

// QueueService is the server's norn.v1.QueueService.
func (sv *Server) QueueService() nornv1connect.QueueServiceHandler { return queueService{sv} }

// queueSettings is queue's settings as this node applies them.
func (sv *Server) queueSettings(queue string) cluster.QueueSettings {
	if sv.host == nil {
		return cluster.QueueSettings{}
	}
	return sv.host.Queues().Get(queue)
}

func (s queueService) GetQueue(ctx context.Context, req *connect.Request[nornv1.GetQueueRequest]) (*connect.Response[nornv1.GetQueueResponse], error) {
	sv := s.sv
	if err := crdt.ValidateQueue("queue", req.Msg.GetQueue()); err != nil {
		return nil, apierr.From(err)
	}
	q, err := sv.queueView(ctx, req.Msg.GetQueue())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nornv1.GetQueueResponse{Queue: q}), nil
}

// queueView is queue as the API shows it: its settings and counts.
func (sv *Server) queueView(ctx context.Context, queue string) (*nornv1.Queue, error) {
	counts, err := sv.coord.CountQueues(ctx, queue)
	if err != nil {
		return nil, err
	}
	return sv.queueOfTally(queue, sv.host.Queues(), counts[queue]), nil
}

// queueOfTally is queue as the API shows it, with its settings from tab
// and its counts t (nil: no task).
func (sv *Server) queueOfTally(queue string, tab *cluster.Queues, t *coord.Tally) *nornv1.Queue {
	v := &nornv1.Queue{Name: queue, Settings: settingsToAPI(tab.Get(queue)), SettingsVersion: tab.VersionOf(), ByStatus: map[string]uint64{}}
	if t == nil {
		return v
	}
	v.ByStatus = t.ByStatus
	for _, n := range t.ByStatus {
		v.Total += n
	}
	if t.Oldest != 0 {
		v.OldestReadyId = t.Oldest
		v.OldestReadyAge = durationpb.New(max(sv.cfg.Clock.Now().Sub(crdt.IDTime(t.Oldest)), 0))
	}
	return v
}

func (s queueService) ListQueues(ctx context.Context, _ *connect.Request[nornv1.ListQueuesRequest]) (*connect.Response[nornv1.ListQueuesResponse], error) {
	sv := s.sv
	counts, err := sv.coord.CountQueues(ctx, "")
	if err != nil {
		return nil, err
	}
	tab := sv.host.Queues()
	names := tab.Names()
	for q := range counts {
		if !slices.Contains(names, q) {
			names = append(names, q)
		}
	}
	slices.Sort(names)
	resp := &nornv1.ListQueuesResponse{}
	for _, q := range names {
		resp.Queues = append(resp.Queues, sv.queueOfTally(q, tab, counts[q]))
	}
	return connect.NewResponse(resp), nil
}

// clearable are the settings SetQueueRequest.clear may name.
var clearable = []string{"paused", "default_retry", "default_lease", "max_claimed", "claim_rate", "retention"}

func (s queueService) SetQueue(ctx context.Context, req *connect.Request[nornv1.SetQueueRequest]) (*connect.Response[nornv1.SetQueueResponse], error) {
	sv, m := s.sv, req.Msg
	if err := crdt.ValidateQueue("queue", m.GetQueue()); err != nil {
		return nil, apierr.From(err)
	}
	if _, err := sv.settingsChange(cluster.QueueSettings{}, m); err != nil {
		return nil, err // refused here, before it travels
	}
	if err := sv.featureGate("settings", cluster.FeatureQueues, "queue settings"); err != nil {
		return nil, err
	}
	if m.GetSettings().GetRetention() != nil {
		if err := sv.featureGate("settings.retention", cluster.FeatureRetention, "per-queue retention"); err != nil {
			return nil, err
		}
	}
	resp, err := rebalance.ToMetaLeader(sv.rebalance, ctx, req, func(p *transport.Peer) func(context.Context, *connect.Request[nornv1.SetQueueRequest]) (*connect.Response[nornv1.SetQueueResponse], error) {
		return p.Queue.SetQueue
	}, sv.setQueueLocal)
	if err != nil {
		return nil, err
	}
	// Counts as this node reads them (the leader's are as good).
	if q, err := sv.queueView(ctx, m.GetQueue()); err == nil && resp.Msg.GetQueue() != nil {
		q.Settings, q.SettingsVersion = resp.Msg.GetQueue().GetSettings(), resp.Msg.GetQueue().GetSettingsVersion()
		resp.Msg.Queue = q
	}
	return resp, nil
}

// setQueueLocal runs a SetQueue on the meta leader: it proposes the new
// settings, then pushes the table to every live node.
func (sv *Server) setQueueLocal(m *nornv1.SetQueueRequest) (*nornv1.SetQueueResponse, error) {
	meta := sv.host.Meta()
	next, err := sv.settingsChange(meta.Queues().Get(m.GetQueue()), m)
	if err != nil {
		return nil, err
	}
	if _, err := meta.ProposeQueue(m.GetQueue(), next, replicas.ProposeTimeout); err != nil {
		return nil, err
	}
	tab := meta.Queues()
	if err := sv.host.AdoptQueues(tab); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return &nornv1.SetQueueResponse{
		Queue:        &nornv1.Queue{Name: m.GetQueue(), Settings: settingsToAPI(tab.Get(m.GetQueue())), SettingsVersion: tab.Version},
		PendingNodes: sv.pushQueues(tab),
	}, nil
}

// pushTimeout bounds the push of a new table to each node.
const pushTimeout = 2 * time.Second

// pushQueues gives tab to every other live node of the ring, at once,
// and returns the ones that did not confirm it.
func (sv *Server) pushQueues(tab *cluster.Queues) []string {
	r := sv.host.Ring()
	if r == nil {
		return nil
	}
	b, err := json.Marshal(tab)
	if err != nil {
		return nil
	}
	var mu sync.Mutex
	var pending []string
	var wg sync.WaitGroup
	for _, nd := range r.Nodes {
		if nd.ID == sv.cfg.NodeID || nd.Role == cluster.RoleDead || !sv.host.Up(nd.ID) {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), pushTimeout)
			defer cancel()
			resp, err := sv.peers.Get(nd.APIAddr).Peer.AdoptQueues(ctx, transport.Request(sv.peers, &nornv1.AdoptQueuesRequest{Queues: b}))
			if err != nil || resp.Msg.GetVersion() < tab.Version {
				if err != nil {
					sv.cfg.Logger.Warn("pushing queue settings failed; the node pulls them from gossip", "node", nd.ID, "err", err)
				}
				mu.Lock()
				pending = append(pending, nd.ID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(pending)
	return pending
}

// AdoptQueues keeps a newer queue settings table a peer pushes.
func (s peerService) AdoptQueues(_ context.Context, req *connect.Request[nornv1.AdoptQueuesRequest]) (*connect.Response[nornv1.AdoptQueuesResponse], error) {
	return servePeer(s.sv, req, func(m *nornv1.AdoptQueuesRequest) (*nornv1.AdoptQueuesResponse, error) {
		tab, err := replicas.DecodeQueues(m.GetQueues())
		if err != nil {
			return nil, apierr.Invalid("queues", "%v", err)
		}
		if tab != nil {
			if err := s.sv.host.AdoptQueues(tab); err != nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, err)
			}
		}
		return &nornv1.AdoptQueuesResponse{Version: s.sv.host.Queues().VersionOf()}, nil
	})
}

// settingsChange applies m's changes to cur, validating each field (named
// by its JSON path in the request).
func (sv *Server) settingsChange(cur cluster.QueueSettings, m *nornv1.SetQueueRequest) (cluster.QueueSettings, error) {
	set := m.GetSettings()
	if set == nil && len(m.GetClear()) == 0 {
		return cur, apierr.Invalid("settings", "is required: set a field, or name one in clear")
	}
	next := cur
	if set != nil && set.Paused != nil {
		next.Paused = set.GetPaused()
	}
	if set.GetDefaultRetry() != nil {
		p, err := sv.retryFromAPI("settings", "defaultRetry", set.GetDefaultRetry())
		if err != nil {
			return cur, err
		}
		next.DefaultRetry = p
	}
	if d := set.GetDefaultLease(); d != nil {
		l, err := sv.leaseArg("settings.defaultLease", d)
		if err != nil {
			return cur, err
		}
		next.DefaultLeaseMs = l.Milliseconds()
	}
	if set != nil && set.MaxClaimed != nil {
		if set.GetMaxClaimed() == 0 {
			return cur, apierr.Invalid("settings.maxClaimed", "must be at least 1, got 0 (clear it for no cap, or pause the queue)")
		}
		next.MaxClaimed = set.GetMaxClaimed()
	}
	if set != nil && set.ClaimRate != nil {
		r := set.GetClaimRate()
		if math.IsNaN(r) || r <= 0 || r > cluster.MaxClaimRate {
			return cur, apierr.Invalid("settings.claimRate", "must be in (0, %v] claims per second, got %v (clear it for no limit)", float64(cluster.MaxClaimRate), r)
		}
		next.ClaimRate = r
	}
	if d := set.GetRetention(); d != nil {
		r, err := sv.retentionArg("settings.retention", d)
		if err != nil {
			return cur, err
		}
		next.RetentionMs = r.Milliseconds()
	}
	isSet := map[string]bool{"paused": set != nil && set.Paused != nil, "default_retry": set.GetDefaultRetry() != nil,
		"default_lease": set.GetDefaultLease() != nil, "max_claimed": set != nil && set.MaxClaimed != nil, "claim_rate": set != nil && set.ClaimRate != nil,
		"retention": set.GetRetention() != nil}
	for i, name := range m.GetClear() {
		field := fmt.Sprintf("clear[%d]", i)
		switch {
		case !slices.Contains(clearable, name):
			return cur, apierr.Invalid(field, "%q is not a queue setting (one of %s)", name, strings.Join(clearable, ", "))
		case isSet[name]:
			return cur, apierr.Invalid(field, "%q is also set in settings", name)
		}
		switch name {
		case "paused":
			next.Paused = false
		case "default_retry":
			next.DefaultRetry = nil
		case "default_lease":
			next.DefaultLeaseMs = 0
		case "max_claimed":
			next.MaxClaimed = 0
		case "claim_rate":
			next.ClaimRate = 0
		case "retention":
			next.RetentionMs = 0
		}
	}
	if err := next.Validate(); err != nil {
		return cur, apierr.Invalid("settings", "%v", err)
	}
	return next, nil
}

// settingsToAPI is s as the API shows it: the fields set.
func settingsToAPI(s cluster.QueueSettings) *nornv1.QueueSettings {
	out := &nornv1.QueueSettings{DefaultRetry: coord.RetryToAPI(s.DefaultRetry)}
	if s.Paused {
		out.Paused = new(true)
	}
	if s.DefaultLeaseMs > 0 {
		out.DefaultLease = durationpb.New(time.Duration(s.DefaultLeaseMs) * time.Millisecond)
	}
	if s.MaxClaimed > 0 {
		out.MaxClaimed = new(s.MaxClaimed)
	}
	if s.ClaimRate > 0 {
		out.ClaimRate = new(s.ClaimRate)
	}
	if s.RetentionMs > 0 {
		out.Retention = durationpb.New(time.Duration(s.RetentionMs) * time.Millisecond)
	}
	return out
}

// retentionArg checks a queue's retention (field names it): a valid
// duration of whole milliseconds from an hour (Config.MinQueueRetention)
// to 366 days.
func (sv *Server) retentionArg(field string, d *durationpb.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil {
		return 0, apierr.Invalid(field, "%v", err)
	}
	r := d.AsDuration()
	lo, hi := sv.cfg.MinQueueRetention, time.Duration(cluster.MaxQueueDurationMs)*time.Millisecond
	if lo <= 0 {
		lo = time.Duration(cluster.MinQueueRetentionMs) * time.Millisecond
	}
	switch {
	case r < lo || r > hi:
		return 0, apierr.Invalid(field, "must be from %v to %v, got %v (clear it for the node's retention)", lo, hi, r)
	case r%time.Millisecond != 0:
		return 0, apierr.Invalid(field, "must be whole milliseconds, got %v", r)
	}
	return r, nil
}
