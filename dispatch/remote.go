package dispatch

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// Priority across the cluster (DESIGN §4, Claim). A claim weighs the
// heads of the partitions this node leads against the claimable heads
// the other leaders report (PeerService.ReadyHeads, answered by
// ReadyHeads below), merged in claim order, and asks each leader for the
// tasks of its own that made the cut (a proxied claim with a priority
// floor), all at once. What the other leaders reported is cached per
// queue for at most Config.HeadsTTL and refreshed by one call per leader
// that all concurrent claims of the queue share; a proxied claim that
// got fewer tasks than its leader reported drops that leader's entry.
//
// The bounds this gives, stated in docs/API.md (Claim order):
//   - priority is strict across the cluster, except that a task that
//     became claimable at another node's leader less than HeadsTTL before
//     a claim may be passed over by that claim;
//   - within one priority, a claim takes this node's own heads before
//     another leader's unless the other's is older by more than
//     fifoSlack: tasks of one priority come out in age order to within
//     fifoSlack across nodes, and a claim stays on one node when ages
//     allow (one Raft entry, no proxied call).

const (
	// DefaultHeadsTTL is Config.HeadsTTL's default.
	DefaultHeadsTTL = 50 * time.Millisecond
	// fifoSlack: see above.
	fifoSlack = 250 * time.Millisecond
	// minHeadsAsked is the fewest heads a node asks another leader for,
	// so that claims of a few tasks share one answer; maxHeadsAsked the
	// most (each head costs the leader a read of its task, about 1.5 µs):
	// a claim of more weighs what it knows and stops below the lowest
	// priority a leader that may hold more reported (see claimRound).
	minHeadsAsked = 16
	maxHeadsAsked = 256
	// DefaultHeadsWait is Config.HeadsWait's default.
	DefaultHeadsWait = 250 * time.Millisecond
	// headsTimeout bounds one ReadyHeads call; a leader that did not
	// answer is asked again headsRetry later (meanwhile claims go on
	// without its heads), and one that has no ReadyHeads (an older
	// version, during a rolling upgrade) legacyRetry later.
	headsTimeout = time.Second
	headsRetry   = time.Second
	legacyRetry  = time.Minute
	// headsForget drops the cache of a queue no claim looked at for
	// this long.
	headsForget = time.Minute
)

// fifoSlackIDs is fifoSlack in sonyflake id units: an id carries its
// time in 10 ms units above bit 24.
const fifoSlackIDs = uint64(fifoSlack/(10*time.Millisecond)) << 24

// remoteFirst reports whether another leader's head r goes before this
// node's head l: by priority, then (with a fair view) by their keys'
// start, then by age beyond fifoSlack.
func remoteFirst(r, l storage.ReadyEntry, fv *fairView) bool {
	if r.Priority != l.Priority {
		return r.Priority > l.Priority
	}
	if fv != nil && r.Key != l.Key {
		if sr, sl := fv.start(r.Key), fv.start(l.Key); sr != sl {
			return sr < sl
		}
	}
	return r.ID+fifoSlackIDs < l.ID
}

// ReadyHeads returns up to max claimable heads of queue in the partitions
// this node leads, in the order its claims take them; when there is none,
// the partitions replicated here whose ready index holds tasks of queue
// while they have no reachable leader (see stranded).
func (d *Dispatcher) ReadyHeads(queue string, max int, countClaimed bool) (*nornv1.ReadyHeadsResponse, error) {
	if d.host.Ring() == nil {
		return nil, apierr.NotFormed
	}
	out := &nornv1.ReadyHeadsResponse{}
	if countClaimed {
		n, err := d.claimedHere(queue)
		if err != nil {
			return nil, apierr.From(err)
		}
		out.Claimed = new(uint64(n))
		byPart, err := d.claimedByPartition(queue)
		if err != nil {
			return nil, apierr.From(err)
		}
		for _, p := range slices.Sorted(maps.Keys(byPart)) {
			out.ClaimedByPartition = append(out.ClaimedByPartition, &nornv1.PartitionClaimed{Partition: uint32(p), Claimed: uint64(byPart[p])})
		}
	}
	if d.paused(queue) {
		return out, nil // nothing of it is claimable here
	}
	heads, err := newHeadMerger(d.store, queue, d.leading())
	if err != nil {
		return nil, apierr.From(err)
	}
	heads.fair = d.fairFor(queue, heads.keyed)
	now := d.cfg.Clock.Now().UnixMilli()
	// Look past max as claimRound does: heads blocked by dependencies
	// are skipped, but not without bound.
	for examined := 0; len(out.Heads) < max && examined < 4*max+256; examined++ {
		_, h, ok := heads.next()
		if !ok {
			if heads.err != nil {
				return nil, apierr.From(heads.err)
			}
			break
		}
		if _, _, ok := d.candidate(h.ID, now); ok {
			out.Heads = append(out.Heads, &nornv1.ReadyHead{Id: h.ID, Priority: h.Priority, FairnessKey: h.Key, FairnessWeight: h.Weight})
		}
	}
	if len(out.Heads) == 0 {
		for _, p := range d.stranded(queue, nil, true) {
			out.Stranded = append(out.Stranded, uint32(p))
		}
	}
	return out, nil
}

// remoteHeads is the cache of what the other leaders reported, by queue.
type remoteHeads struct {
	d         *Dispatcher
	mu        sync.Mutex
	queues    map[string]*queueHeads
	lastSweep time.Time

	stats struct{ reports, reportFailures, reportsLate, forwarded, forwardedShort atomic.Uint64 }
}

// ClaimStats count the cross-node side of claims (metrics).
type ClaimStats struct {
	Reports        uint64 // ReadyHeads calls made to other leaders
	ReportFailures uint64 // of those, the ones that failed
	// ReportsLate counts claims that went on without a report they
	// waited for (past HeadsWait, or their deadline): a leader left out.
	ReportsLate    uint64
	Forwarded      uint64 // claims forwarded to other leaders for heads that made the cut
	ForwardedShort uint64 // of those, the ones that got fewer tasks than reported, or failed
}

// ClaimStats returns the counts so far.
func (d *Dispatcher) ClaimStats() ClaimStats {
	st := &d.remote.stats
	return ClaimStats{Reports: st.reports.Load(), ReportFailures: st.reportFailures.Load(), ReportsLate: st.reportsLate.Load(),
		Forwarded: st.forwarded.Load(), ForwardedShort: st.forwardedShort.Load()}
}

// queueHeads is what the other leaders reported of one queue.
type queueHeads struct {
	peers      map[string]*peerHeads // by node id
	refreshing chan struct{}         // closed when the refresh under way ends
	used       time.Time             // when a claim last looked
}

// peerHeads is what one leader reported of one queue.
type peerHeads struct {
	addr  string
	heads []storage.ReadyEntry // in its claim order, less what this node's claims took
	more  bool                 // it reported as many as asked: it may hold more
	asked int
	at    time.Time // when it answered; zero: ask again
	sent  time.Time // when the call of that answer was sent
	// byPartition is its replicas' claimed tasks of the queue per
	// partition, when counted (a limited queue's call).
	byPartition map[uint16]int64
	counted     bool
	gen         uint64 // which answer heads come from
	stranded    []uint16
	err         error // the last call failed
	legacy      bool  // it has no ReadyHeads
	// taken is the priority of the last head this node's claims took of
	// the answer (tookAny: some): once they took them all of a leader
	// that may hold more, nothing below it may be taken until it
	// answers again (floorOf).
	taken   int32
	tookAny bool
}

// headsView is a claim's snapshot of the cache of one queue.
type headsView struct {
	rivals   []*rival
	answered map[string]bool // the leaders whose heads are known now
	legacy   map[string]bool // the leaders without ReadyHeads
	stranded []uint16        // a leader's stranded partitions, when some reported any
	lastErr  error           // a failed call, when some failed
}

// rival walks one other leader's heads during a claim's pick.
type rival struct {
	node, addr string
	gen        uint64
	heads      []storage.ReadyEntry
	more       bool     // the leader may hold more heads than these
	i          int      // the first of heads not taken
	used       []bool   // with fairness keys: which heads were taken (nil: heads[:i])
	picks      []uint64 // the ids of the heads taken, in the order taken
	floor      int32    // the lowest priority taken
	// drained: every head it reported was taken by earlier claims and it
	// may hold more, the last of them of priority taken.
	drained bool
	taken   int32
}

// floorOf returns the lowest priority a claim may take while rs are as
// they are: a rival whose reported heads are all taken and that may hold
// more than it reported may hold more of its last reported priority, or
// of any above it, so nothing below that may be taken (math.MinInt32:
// no such bound).
func floorOf(rs []*rival) int32 {
	floor := int32(math.MinInt32)
	for _, r := range rs {
		switch {
		case r.more && r.i == len(r.heads) && len(r.heads) > 0:
			floor = max(floor, r.heads[len(r.heads)-1].Priority)
		case r.drained:
			floor = max(floor, r.taken)
		}
	}
	return floor
}

// head returns the index of r's next head: the first not taken, or with
// a fair view the best of the first of each key not taken (as a
// partition's, headCursor.bestFair); false when all were taken.
func (r *rival) head(fv *fairView) (int, bool) {
	if r.i >= len(r.heads) {
		return 0, false
	}
	if fv == nil {
		return r.i, true
	}
	return fv.best(r.heads, r.i, r.used), true
}

// take records that a claim took r's head j.
func (r *rival) take(j int) {
	if j != r.i && r.used == nil {
		r.used = make([]bool, len(r.heads))
		for k := range r.i {
			r.used[k] = true
		}
	}
	if r.used != nil {
		r.used[j] = true
	}
	r.picks = append(r.picks, r.heads[j].ID)
	r.floor = r.heads[j].Priority
	for r.i++; r.used != nil && r.i < len(r.heads) && r.used[r.i]; r.i++ {
	}
}

// bestRival returns the rival whose next head goes first (fv.less), and
// the head's index, or nil.
func bestRival(rs []*rival, fv *fairView) (*rival, int) {
	var best *rival
	var bj int
	for _, r := range rs {
		if j, ok := r.head(fv); ok && (best == nil || fv.less(r.heads[j], best.heads[bj])) {
			best, bj = r, j
		}
	}
	return best, bj
}

// view returns the other leaders' heads of queue. An answer older than
// half HeadsTTL is asked for again in the background; a claim waits for
// the new answer only when the one it has is older than HeadsTTL, too
// short for need, or missing. Concurrent claims of a queue share one
// refresh, and wait for it at most HeadsWait: a leader that answers
// later (overloaded, or cut off while gossip still counts it alive) is
// left out of the claims meanwhile rather than stalling them.
func (rh *remoteHeads) view(ctx context.Context, queue string, need int) *headsView {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for tries := 0; ; tries++ {
		rh.mu.Lock()
		now := time.Now()
		q := rh.queue(queue, now)
		ask, must := rh.stale(q, need, now)
		if q.refreshing == nil && len(ask) > 0 && tries < 2 {
			ch := make(chan struct{})
			q.refreshing = ch
			go func() {
				rh.fetch(queue, q, ask, headsToAsk(need))
				rh.mu.Lock()
				q.refreshing = nil
				close(ch)
				rh.mu.Unlock()
			}()
		}
		ch := q.refreshing
		if ch == nil || !must || tries == 2 {
			v := q.snapshot()
			rh.mu.Unlock()
			return v
		}
		rh.mu.Unlock()
		if t == nil {
			t = time.NewTimer(rh.d.cfg.HeadsWait)
		}
		select {
		case <-ch:
		case <-t.C:
			tries = 1 // take what is known
			rh.stats.reportsLate.Add(1)
		case <-ctx.Done():
			tries = 1
			rh.stats.reportsLate.Add(1)
		}
	}
}

// queue returns the cache of queue, with an entry for every other live
// node of the ring; it drops the caches no claim looked at lately.
func (rh *remoteHeads) queue(queue string, now time.Time) *queueHeads {
	if now.Sub(rh.lastSweep) > headsForget {
		for name, q := range rh.queues {
			if now.Sub(q.used) > headsForget && q.refreshing == nil {
				delete(rh.queues, name)
			}
		}
		rh.lastSweep = now
	}
	q := rh.queues[queue]
	if q == nil {
		q = &queueHeads{peers: map[string]*peerHeads{}}
		rh.queues[queue] = q
	}
	q.used = now
	live := rh.d.otherLive()
	for id, addr := range live {
		if p := q.peers[id]; p == nil || p.addr != addr {
			q.peers[id] = &peerHeads{addr: addr}
		}
	}
	for id := range q.peers {
		if _, ok := live[id]; !ok {
			delete(q.peers, id)
		}
	}
	return q
}

// otherLive returns the API address of every other live node of the
// ring, by id.
func (d *Dispatcher) otherLive() map[string]string {
	out := map[string]string{}
	r := d.host.Ring()
	if r == nil {
		return out
	}
	alive := d.host.Alive()
	for _, nd := range r.Nodes {
		if id := string(nd.ID); id != d.cfg.NodeID && alive[id] {
			out[id] = nd.APIAddr
		}
	}
	return out
}

// headsToAsk is how many heads a claim of need tasks asks each leader for.
func headsToAsk(need int) int { return min(max(need, minHeadsAsked), maxHeadsAsked) }

// stale returns the leaders of q to ask again: those whose answer is
// older than half HeadsTTL, too short for need, or missing, and those
// whose call failed headsRetry ago (legacyRetry for an older version).
// must reports that a claim has to wait for the new answers: one it
// has is older than HeadsTTL, too short, or missing.
func (rh *remoteHeads) stale(q *queueHeads, need int, now time.Time) (ask []string, must bool) {
	ttl := rh.d.cfg.HeadsTTL
	for id, p := range q.peers {
		age := now.Sub(p.at)
		switch {
		case p.legacy:
			if age < legacyRetry {
				continue
			}
		case p.err != nil:
			if age < headsRetry {
				continue
			}
		case p.at.IsZero() || age > ttl || (p.more && len(p.heads) < min(need, maxHeadsAsked)):
			must = true
		case age > ttl/2:
		default:
			continue
		}
		ask = append(ask, id)
	}
	return ask, must
}

// fetch asks the leaders ids for up to n heads of queue each, at once,
// and records their answers in q.
func (rh *remoteHeads) fetch(queue string, q *queueHeads, ids []string, n int) {
	rh.mu.Lock()
	addrs := make([]string, len(ids))
	for i, id := range ids {
		addrs[i] = q.peers[id].addr
	}
	rh.mu.Unlock()
	// The answer serves every claim waiting on this refresh, not only
	// the one that started it.
	ctx, cancel := context.WithTimeout(context.Background(), headsTimeout)
	defer cancel()
	type answer struct {
		id   string
		resp *nornv1.ReadyHeadsResponse
		err  error
	}
	answers := make(chan answer, len(ids))
	sent := time.Now()
	count := rh.d.limitsOf(queue).active()
	for i, id := range ids {
		go func() {
			resp, err := rh.d.peers.Get(addrs[i]).Peer.ReadyHeads(ctx, transport.Request(rh.d.peers,
				&nornv1.ReadyHeadsRequest{Queue: queue, Max: uint32(n), CountClaimed: count}))
			a := answer{id: id, err: err}
			if err == nil {
				a.resp = resp.Msg
			}
			answers <- a
		}()
	}
	for range ids {
		a := <-answers
		rh.stats.reports.Add(1)
		if a.err != nil {
			rh.stats.reportFailures.Add(1)
		}
		rh.mu.Lock()
		p := q.peers[a.id]
		if p != nil {
			p.record(a.resp, a.err, n, sent)
		}
		rh.mu.Unlock()
	}
}

// record keeps one answer of a leader to a ReadyHeads call for n heads.
func (p *peerHeads) record(resp *nornv1.ReadyHeadsResponse, err error, n int, sent time.Time) {
	p.at, p.gen = time.Now(), p.gen+1
	p.heads, p.stranded, p.more, p.asked = nil, nil, false, n
	p.tookAny = false
	if err == nil && resp.Claimed != nil {
		p.byPartition, p.counted, p.sent = map[uint16]int64{}, true, sent
		for _, pc := range resp.GetClaimedByPartition() {
			p.byPartition[uint16(pc.GetPartition())] = int64(pc.GetClaimed())
		}
	}
	p.legacy, p.err = false, err
	if err != nil {
		p.legacy = connect.CodeOf(err) == connect.CodeUnimplemented
		if p.legacy {
			p.err = nil
		}
		return
	}
	for _, h := range resp.GetHeads() {
		p.heads = append(p.heads, storage.ReadyEntry{ID: h.GetId(), Priority: h.GetPriority(), Key: h.GetFairnessKey(), Weight: h.GetFairnessWeight()})
	}
	for _, s := range resp.GetStranded() {
		p.stranded = append(p.stranded, uint16(s))
	}
	p.more = len(p.heads) >= n
}

// snapshot returns the cache of q as a claim uses it.
func (q *queueHeads) snapshot() *headsView {
	v := &headsView{answered: map[string]bool{}, legacy: map[string]bool{}}
	for id, p := range q.peers {
		switch {
		case p.legacy:
			v.legacy[id] = true
		case p.err != nil:
			v.lastErr = p.err
		case !p.at.IsZero():
			v.answered[id] = true
			if len(p.heads) > 0 {
				v.rivals = append(v.rivals, &rival{node: id, addr: p.addr, gen: p.gen, heads: p.heads, more: p.more, floor: p.heads[0].Priority})
			} else if p.more && p.tookAny {
				// Claims took all it reported, and it may hold more: a
				// claim that cannot wait for its next answer still takes
				// nothing below them (a late report is not a license).
				v.rivals = append(v.rivals, &rival{node: id, addr: p.addr, gen: p.gen, more: true, drained: true, taken: p.taken})
			} else if len(p.stranded) > 0 {
				v.stranded = p.stranded
			}
		}
	}
	return v
}

// olderOnly is the view of the seeded bug ClaimLocalFirst: every other
// live node as one of an older version, asked for what is left after
// this node's own heads.
func (rh *remoteHeads) olderOnly() *headsView {
	v := &headsView{answered: map[string]bool{}, legacy: map[string]bool{}}
	for id := range rh.d.otherLive() {
		v.legacy[id] = true
	}
	return v
}

// took records that a proxied claim for want tasks of the leader rv got
// got: the heads it took leave the cache; a leader that gave fewer than
// it reported (claimed meanwhile by others, or no longer the leader) is
// asked again by the next claim.
func (rh *remoteHeads) took(queue string, rv *rival, got int) {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	q := rh.queues[queue]
	if q == nil {
		return
	}
	p := q.peers[rv.node]
	if p == nil || p.gen != rv.gen {
		return // answered again since: that answer stands
	}
	want := len(rv.picks)
	if got < want || want > len(p.heads) {
		p.at = time.Time{}
		return
	}
	if want > 0 {
		p.taken, p.tookAny = rv.floor, true
	}
	if rv.used == nil {
		p.heads = p.heads[want:] // the first want
		return
	}
	picked := map[uint64]bool{}
	for _, id := range rv.picks {
		picked[id] = true
	}
	p.heads = slices.DeleteFunc(slices.Clone(p.heads), func(e storage.ReadyEntry) bool { return picked[e.ID] })
}

// failed records that a proxied claim to the leader rv failed.
func (rh *remoteHeads) failed(queue string, rv *rival, err error) {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	if q := rh.queues[queue]; q != nil {
		if p := q.peers[rv.node]; p != nil && p.gen == rv.gen {
			p.at, p.err = time.Now(), err
			if errors.Is(err, context.Canceled) {
				p.at, p.err = time.Time{}, nil
			}
		}
	}
}
