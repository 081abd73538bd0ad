package coord

// Counts (TaskService.CountTasks) across the cluster: per partition from
// the replica's counters (storage.Counts), never by scanning tasks; the
// replicas asked are chosen as for lists (lists.go).

import (
	"context"
	"fmt"
	"maps"
	"slices"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Tally is one queue's tasks (or all queues') by status name, and the
// id of its oldest ready task (0 when it has none ready; counted by
// queue only).
type Tally struct {
	ByStatus map[string]uint64
	Oldest   uint64
}

// add adds o to t.
func (t *Tally) add(o *Tally) {
	for k, v := range o.ByStatus {
		t.ByStatus[k] += v
	}
	if o.Oldest != 0 && (t.Oldest == 0 || o.Oldest < t.Oldest) {
		t.Oldest = o.Oldest
	}
}

// partCounts is one partition's tallies by queue ("" for all queues
// together).
type partCounts map[string]*Tally

// CountPartition counts partition p's tasks (of queue, or all) by status
// name, from the replica's counters (storage.Counts): O(queues), not
// O(tasks). The tasks that wait for dependencies are the exception: the
// store counts them apart (storage.ClassWaiting), and each is looked up
// here to tell READY from DELAYED by its dependencies' outcomes, as
// GetTask does.
func (c *Coordinator) CountPartition(p uint16, queue string) (map[string]uint64, error) {
	byQueue, err := c.countPartition(p, queue, false)
	if err != nil {
		return nil, err
	}
	if byQueue[""] == nil {
		return map[string]uint64{}, nil
	}
	return byQueue[""].ByStatus, nil
}

// countPartition is CountPartition, by queue when byQueue is set (keyed
// by queue name, with each queue's oldest ready task; "" holds them all
// otherwise).
func (c *Coordinator) countPartition(p uint16, queue string, byQueue bool) (partCounts, error) {
	entries, err := c.store.Counts(p, queue)
	if err != nil {
		return nil, err
	}
	out := partCounts{}
	tally := func(q string) *Tally {
		if !byQueue {
			q = ""
		}
		if out[q] == nil {
			out[q] = &Tally{ByStatus: map[string]uint64{}}
			if byQueue {
				out[q].Oldest, _ = c.store.OldestReady(p, q)
			}
		}
		return out[q]
	}
	add := func(q string, status string, n uint64) { tally(q).ByStatus[status] += n }
	waiting := false
	for _, e := range entries {
		if e.N < 0 {
			return nil, fmt.Errorf("partition %d: counter of %q %v is %d", p, e.Queue, e.Class, e.N)
		}
		if e.Class == storage.ClassWaiting {
			waiting = true
			continue
		}
		add(e.Queue, statusName(classStatus[e.Class]), uint64(e.N))
	}
	if !waiting {
		return out, nil
	}
	err = c.store.ScanWaiting(p, func(t *crdt.Task) error {
		if t.Spec == nil || (queue != "" && t.Spec.Queue != queue) {
			return nil
		}
		if _, terminal := t.Terminal(); terminal {
			return nil // counted as terminal since the scan began
		}
		s := nornv1.TaskStatus_TASK_STATUS_READY
		if c.cfg.DepsDone != nil && !c.cfg.DepsDone(t.Spec.DependsOn) {
			s = nornv1.TaskStatus_TASK_STATUS_DELAYED
		}
		add(t.Spec.Queue, statusName(s), 1)
		return nil
	})
	return out, err
}

// classStatus is the status of each counted class but ClassWaiting.
var classStatus = map[storage.Class]nornv1.TaskStatus{
	storage.ClassReady:     nornv1.TaskStatus_TASK_STATUS_READY,
	storage.ClassDelayed:   nornv1.TaskStatus_TASK_STATUS_DELAYED,
	storage.ClassClaimed:   nornv1.TaskStatus_TASK_STATUS_CLAIMED,
	storage.ClassCompleted: nornv1.TaskStatus_TASK_STATUS_COMPLETED,
	storage.ClassAborted:   nornv1.TaskStatus_TASK_STATUS_ABORTED,
	storage.ClassCancelled: nornv1.TaskStatus_TASK_STATUS_CANCELLED,
	storage.ClassOther:     nornv1.TaskStatus_TASK_STATUS_READY,
	storage.ClassDead:      nornv1.TaskStatus_TASK_STATUS_DEAD,
}

// statusName is a status without its enum prefix ("READY").
func statusName(s nornv1.TaskStatus) string {
	return s.String()[len("TASK_STATUS_"):]
}

// countRemote counts partitions this node does not replicate on other
// nodes, one CountPartitions call per node in parallel, and asks the
// next replica of the partitions whose call failed. It returns one count
// per partition.
func (c *Coordinator) countRemote(ctx context.Context, parts []uint16, queue string, byQueue bool) ([]partCounts, error) {
	// Each partition's replicas in the order to ask them; a partition
	// without a known leader goes to a node already asked for another,
	// so that few nodes get one call each.
	orders := map[uint16][]cluster.RingNode{}
	chosen := map[string]bool{}
	for _, p := range parts {
		o := c.replicaOrder(p, chosen)
		if len(o) > 0 {
			chosen[o[0].ID] = true
		}
		orders[p] = o
	}
	type answer struct {
		parts  []uint16
		counts []*nornv1.PartitionCount
		err    error
	}
	tried := map[uint16]int{}
	lastErr := map[uint16]error{}
	var out []partCounts
	for pending := parts; len(pending) > 0; {
		plan := map[string][]uint16{}
		nodes := map[string]cluster.RingNode{}
		for _, p := range pending {
			o := orders[p]
			if tried[p] == len(o) {
				return nil, partitionUnavailable(p, o, lastErr[p])
			}
			nd := o[tried[p]]
			tried[p]++
			plan[nd.ID] = append(plan[nd.ID], p)
			nodes[nd.ID] = nd
		}
		answers := make(chan answer, len(plan))
		for id, ps := range plan {
			go func() {
				counts, err := c.askCount(ctx, nodes[id], ps, queue, byQueue)
				answers <- answer{ps, counts, err}
			}()
		}
		pending = nil
		for range plan {
			a := <-answers
			if a.err != nil {
				for _, p := range a.parts {
					lastErr[p] = a.err
				}
				pending = append(pending, a.parts...)
				continue
			}
			for i, pc := range a.counts {
				c.hints.set(a.parts[i], pc.GetLeader())
				m := partCounts{"": {ByStatus: pc.GetByStatus()}}
				if byQueue {
					m = partCounts{}
					for _, qc := range pc.GetQueues() {
						m[qc.GetQueue()] = &Tally{ByStatus: qc.GetByStatus(), Oldest: qc.GetOldestReady()}
					}
				}
				out = append(out, m)
			}
		}
		slices.Sort(pending)
	}
	return out, nil
}

// askCount asks node nd to count partitions ps and checks that it
// answered for exactly those.
func (c *Coordinator) askCount(ctx context.Context, nd cluster.RingNode, ps []uint16, queue string, byQueue bool) ([]*nornv1.PartitionCount, error) {
	cctx, cancel := context.WithTimeout(ctx, countTimeout)
	defer cancel()
	req := &nornv1.CountPartitionsRequest{Queue: queue, ByQueue: byQueue}
	for _, p := range ps {
		req.Partitions = append(req.Partitions, uint32(p))
	}
	resp, err := c.peers.Get(nd.APIAddr).Peer.CountPartitions(cctx, transport.Request(c.peers, req))
	if err != nil {
		return nil, err
	}
	counts := resp.Msg.GetCounts()
	if byQueue && slices.ContainsFunc(counts, func(c *nornv1.PartitionCount) bool { return len(c.GetByStatus()) > 0 }) {
		return nil, fmt.Errorf("node %s cannot count by queue (a build that predates it): upgrade it", nd.ID)
	}
	if !slices.EqualFunc(counts, req.Partitions, func(c *nornv1.PartitionCount, p uint32) bool { return c.GetPartition() == p }) {
		return nil, fmt.Errorf("node %s did not answer for partitions %v", nd.ID, ps)
	}
	return counts, nil
}

// Count answers TaskService.CountTasks: the tasks of m's queue (or all)
// by status, across the cluster.
func (c *Coordinator) Count(ctx context.Context, m *nornv1.CountTasksRequest) (*nornv1.CountTasksResponse, error) {
	f, err := newListFilter(m.GetQueue(), 0)
	if err != nil {
		return nil, err
	}
	parts, err := c.countAll(ctx, f.queue, false)
	if err != nil {
		return nil, err
	}
	resp := &nornv1.CountTasksResponse{ByStatus: map[string]uint64{}}
	for _, pc := range parts {
		if t := pc[""]; t != nil {
			for k, v := range t.ByStatus {
				resp.ByStatus[k] += v
				resp.Total += v
			}
		}
	}
	return resp, nil
}

// CountQueues counts the tasks of queue (every queue when "") by status
// across the cluster (QueueService), keyed by queue, with each queue's
// oldest ready task: as Count, one counter read per partition, and the
// ready index's head of each priority.
func (c *Coordinator) CountQueues(ctx context.Context, queue string) (map[string]*Tally, error) {
	parts, err := c.countAll(ctx, queue, true)
	if err != nil {
		return nil, err
	}
	out := map[string]*Tally{}
	for _, pc := range parts {
		for q, t := range pc {
			if out[q] == nil {
				out[q] = &Tally{ByStatus: map[string]uint64{}}
			}
			out[q].add(t)
		}
	}
	return out, nil
}

// countAll counts every partition (of queue, or all; by queue when
// byQueue), from this node's replicas and, for the partitions it does not
// replicate, the other nodes'.
func (c *Coordinator) countAll(ctx context.Context, queue string, byQueue bool) ([]partCounts, error) {
	if c.host.Ring() == nil {
		return nil, apierr.NotFormed
	}
	var local, remote []uint16
	for p := range uint16(c.cfg.Partitions) {
		if c.host.ReadsLocally(p) {
			local = append(local, p)
		} else {
			remote = append(remote, p)
		}
	}
	// The other nodes count while this one does.
	var remoteCounts []partCounts
	var remoteErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if len(remote) > 0 {
			remoteCounts, remoteErr = c.countRemote(ctx, remote, queue, byQueue)
		}
	}()
	var localErr error
	counts := make([]partCounts, 0, c.cfg.Partitions)
	for _, p := range local {
		pc, err := c.countPartition(p, queue, byQueue)
		if err != nil {
			localErr = apierr.From(err)
			break
		}
		counts = append(counts, pc)
	}
	<-done
	if localErr != nil {
		return nil, localErr
	}
	if remoteErr != nil {
		return nil, remoteErr
	}
	return append(counts, remoteCounts...), nil
}

// CountPartitions answers PeerService.CountPartitions from this node's
// replicas of m's partitions.
func (c *Coordinator) CountPartitions(m *nornv1.CountPartitionsRequest) (*nornv1.CountPartitionsResponse, error) {
	f, err := newListFilter(m.GetQueue(), 0)
	if err != nil {
		return nil, err
	}
	ps := m.GetPartitions()
	if len(ps) == 0 || len(ps) > c.cfg.Partitions {
		return nil, apierr.Invalid("partitions", "must hold 1 to %d partitions, got %d", c.cfg.Partitions, len(ps))
	}
	groups := make([]*claims.Group, len(ps))
	seen := make([]bool, c.cfg.Partitions)
	for i, p := range ps {
		field := fmt.Sprintf("partitions[%d]", i)
		if groups[i], err = c.hostedPartition(field, p); err != nil {
			return nil, err
		}
		if seen[p] {
			return nil, apierr.Invalid(field, "partition %d is repeated", p)
		}
		seen[p] = true
	}
	out := make([]*nornv1.PartitionCount, len(ps))
	for i, p := range ps {
		counts, err := c.countPartition(uint16(p), f.queue, m.GetByQueue())
		if err != nil {
			return nil, apierr.From(err)
		}
		out[i] = &nornv1.PartitionCount{Partition: p, Leader: string(groups[i].Leader())}
		if !m.GetByQueue() {
			if t := counts[""]; t != nil {
				out[i].ByStatus = t.ByStatus
			}
			continue
		}
		for _, q := range slices.Sorted(maps.Keys(counts)) {
			out[i].Queues = append(out[i].Queues, &nornv1.QueueCount{Queue: q, ByStatus: counts[q].ByStatus, OldestReady: counts[q].Oldest})
		}
	}
	return &nornv1.CountPartitionsResponse{Counts: out}, nil
}
