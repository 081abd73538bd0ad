package node

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/norn-dev/norn/cluster"
	"github.com/norn-dev/norn/crdt"
)

// The retention rule for a node out of the cluster (docs/OPERATIONS.md,
// "A node out of the cluster longer than retention"). Retention deletes a
// terminal task for good (no tombstone stays), so a replica that missed
// the task's terminal event and was out of the cluster (down, or cut off
// from a majority of the ring's nodes) while the others deleted it still
// holds it READY; anti-entropy, a read's repair or its own leadership
// would bring it back. Like Cassandra's gc_grace: every node keeps, in
// its data dir and in its gossip metadata, the last time it was in the
// cluster (its mark). A node whose mark is more than the rejoin limit
// (three quarters of the retention) behind a peer's is out too long: it
// exchanges no task states with any peer (no anti-entropy either way, no
// replica reads served, its replicated writes refused), leads no claim
// group, reports unhealthy, and stays so across restarts. It is brought
// back as a new node: remove it, wipe its data dir, join it again.
// Marks compare with marks, not with the clock, so a whole cluster
// stopped for longer than the retention starts again as it was.

// ErrOutTooLong is the refusal of a node that was out of the cluster
// longer than the rejoin limit (wrapped with the two marks).
var ErrOutTooLong = errors.New("node: out of the cluster for longer than the retention allows")

// markFile is where a node keeps its mark (Unix ms), in its data dir.
const markFile = "in-cluster"

// markEvery is how often (by the node's clock) a node in the cluster
// writes and gossips its mark.
const markEvery = time.Minute

// rejoinLimit is how far a node's mark may be behind a peer's before it
// is out too long: three quarters of the retention, so that the last
// quarter covers the mark's interval, anti-entropy's lag behind a write
// and the clocks' offsets.
func rejoinLimit(retention time.Duration) time.Duration { return retention - retention/4 }

// outTooLong is the rule: a mark more than limit behind a peer's. A node
// without a mark (new, or from before marks) is never out too long, nor
// is one compared with a peer without a mark.
func outTooLong(mine, peer int64, limit time.Duration) bool {
	return mine > 0 && peer > 0 && peer-mine > limit.Milliseconds()
}

// rejoinGuard keeps the node's mark and enforces the rule. check runs
// every monitor interval; mayExchange and mayLead answer the data paths.
type rejoinGuard struct {
	dir   string
	self  string
	clock crdt.Clock
	// retention is the node's; shortest returns the shortest retention
	// of a queue that has its own (0: none). The limit follows the
	// shorter of the two.
	retention time.Duration
	shortest  func() time.Duration
	logger    *slog.Logger

	mark     atomic.Int64                   // this node's mark (Unix ms; 0: none)
	judged   atomic.Bool                    // compared with a majority once
	out      atomic.Pointer[string]         // why this node is out too long (sticky)
	outPeers atomic.Pointer[map[string]int] // peers out too long, by id: their marks

	mu        sync.Mutex
	inCluster bool      // at the last check
	checked   time.Time // when (monotonic) the last check ran
	gossiped  int64     // the mark last put in gossip
}

// continuity is how soon after a check that found this node in the
// cluster the next must come for the node to count as never having left
// (it does not judge itself then: a clock step of the whole cluster is
// not an absence).
const continuity = 30 * time.Second

func newRejoinGuard(dir, self string, clock crdt.Clock, retention time.Duration, logger *slog.Logger) (*rejoinGuard, error) {
	g := &rejoinGuard{dir: dir, self: self, clock: clock, retention: retention, logger: logger}
	b, err := os.ReadFile(filepath.Join(dir, markFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("node: %s: %w", markFile, err)
	default:
		ms, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("node: %s: %w", filepath.Join(dir, markFile), err)
		}
		g.mark.Store(ms)
	}
	return g, nil
}

// limit is the rejoin limit of the shortest retention in force: the
// node's, or a queue's own (QueueSettings.retention) when shorter (but
// not below cluster.MinQueueRetentionMs). A
// node away longer than a queue's retention could bring back that
// queue's tasks it missed the end of, deleted meanwhile.
func (g *rejoinGuard) limit() time.Duration {
	r := g.retention
	if g.shortest != nil {
		// Never below an hour's: only test hooks set queue retentions
		// that short, and the marks are a minute apart.
		if q := g.shortest(); q > 0 {
			r = min(r, max(q, cluster.MinQueueRetentionMs*time.Millisecond))
		}
	}
	return rejoinLimit(r)
}

// save writes ms as the mark, durably (temporary file, fsync, rename).
func (g *rejoinGuard) save(ms int64) error {
	tmp := filepath.Join(g.dir, markFile+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.FormatInt(ms, 10) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(g.dir, markFile))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	g.mark.Store(ms)
	return nil
}

// check finds the peers out too long, and, while this node is in the
// cluster (it sees a majority of the ring's nodes up, itself included)
// and not out too long, writes and gossips its mark every markEvery. A
// node that enters the cluster (it was not in it at its last check, a
// moment ago) first judges itself: out too long when it was away longer
// than the limit by its own clock and a peer's mark is that far ahead
// (the peers ran meanwhile: a whole cluster stopped for long is not).
func (g *rejoinGuard) check(r *cluster.Ring, members *cluster.Membership) {
	if r == nil || members == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	mono := time.Now()
	continuous := g.inCluster && !g.checked.IsZero() && mono.Sub(g.checked) < continuity
	g.checked = mono
	now := g.clock.Now().UnixMilli()
	mine := g.mark.Load()
	var outPeers map[string]int
	up, voters, known := 1, 0, 0
	for _, nd := range r.Nodes {
		if nd.Role != cluster.RoleDead {
			voters++
		}
	}
	for _, m := range members.Members() {
		if m.ID == g.self || !m.State.Up() {
			continue
		}
		if _, ok := r.Node(m.ID); ok {
			up++
		}
		if m.InClusterMs > 0 {
			known++
		}
		switch {
		case !continuous && g.mayBeOut(now) && outTooLong(mine, m.InClusterMs, g.limit()):
			g.setOut(fmt.Sprintf("%v: this node's mark %s is %s behind %s's %s (limit %s)", ErrOutTooLong,
				msTime(mine), time.Duration(m.InClusterMs-mine)*time.Millisecond, m.ID, msTime(m.InClusterMs), g.limit()))
		case outTooLong(m.InClusterMs, mine, g.limit()):
			if outPeers == nil {
				outPeers = map[string]int{}
			}
			outPeers[m.ID]++
		}
	}
	g.outPeers.Store(&outPeers)
	// A node whose own mark is old by its clock judges itself only
	// against a peer's mark: a peer that gossips none yet proves nothing.
	in := 2*up > voters && (continuous || !g.mayBeOut(now) || known > 0)
	g.inCluster = in && g.out.Load() == nil
	if !g.inCluster {
		return
	}
	g.judged.Store(true)
	if now-mine >= markEvery.Milliseconds() || mine == 0 {
		if err := g.save(now); err != nil {
			g.logger.Error("keeping the in-cluster mark failed", "err", err)
			return
		}
	}
	if ms := g.mark.Load(); ms != g.gossiped {
		if err := members.UpdateMeta(func(m *cluster.NodeMeta) { m.InClusterMs = ms }, time.Second); err == nil {
			g.gossiped = ms
		}
	}
}

// announce gossips the kept mark before the first judgement, so that the
// peers judge a node restarted after a long absence at once.
func (g *rejoinGuard) announce(members *cluster.Membership) {
	if ms := g.mark.Load(); ms > 0 && members != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
		if err := members.UpdateMeta(func(m *cluster.NodeMeta) { m.InClusterMs = ms }, time.Second); err == nil {
			g.gossiped = ms
		}
	}
}

// stop writes the mark one last time when the node is in the cluster.
func (g *rejoinGuard) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inCluster && g.out.Load() == nil {
		if err := g.save(g.clock.Now().UnixMilli()); err != nil {
			g.logger.Error("keeping the in-cluster mark failed", "err", err)
		}
	}
}

func (g *rejoinGuard) setOut(why string) {
	if g.out.CompareAndSwap(nil, &why) {
		g.logger.Error("this node was out of the cluster longer than the retention allows: it exchanges no task states and leads nothing; remove it, wipe its data dir and join it as a new node",
			"why", why)
	}
}

// Out returns why this node is out too long, "" when it is not.
func (g *rejoinGuard) Out() string {
	if p := g.out.Load(); p != nil {
		return *p
	}
	return ""
}

// mayExchange says whether this node may exchange task states with peer
// (anti-entropy either way, a replica read): not while this node is out
// too long, or may be and has not judged itself yet, nor with a peer out
// too long.
func (g *rejoinGuard) mayExchange(peer string) error {
	if why := g.Out(); why != "" {
		return errors.New(why)
	}
	if !g.judged.Load() && g.mayBeOut(g.clock.Now().UnixMilli()) {
		return fmt.Errorf("%w: its mark %s is older than %s and it has not compared it with the cluster's yet",
			ErrOutTooLong, msTime(g.mark.Load()), g.limit())
	}
	return g.peerOut(peer)
}

// mayBeOut reports whether this node's mark is older than the limit by
// its own clock at now: only then can a peer's mark be that far ahead.
func (g *rejoinGuard) mayBeOut(now int64) bool {
	mine := g.mark.Load()
	return mine > 0 && now-mine > g.limit().Milliseconds()
}

// peerOut says whether peer is out too long as this node last judged.
func (g *rejoinGuard) peerOut(peer string) error {
	if p := g.outPeers.Load(); p != nil && (*p)[peer] > 0 {
		return fmt.Errorf("%w: %s", ErrOutTooLong, peer)
	}
	return nil
}

// mayLead refuses claim proposals while this node is out too long.
func (g *rejoinGuard) mayLead() error {
	if why := g.Out(); why != "" {
		return errors.New(why)
	}
	return nil
}

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }
