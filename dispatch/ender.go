package dispatch

import (
	"errors"
	"sync"
	"time"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/replicas"
)

// ender coalesces the claim FSM ends of cancelled tasks and of tasks this
// node aborted: ends
// queued while a round of proposals is in flight go out together in the
// next round, one OpEnd entry per partition. The outcome of a task is
// decided (and durable) by its CRDT terminal event before it is queued here;
// every path that could act on the claim checks that event first.
type ender struct {
	d       *Dispatcher
	mu      sync.Mutex
	pending map[uint16][]claims.End
	kick    chan struct{} // a round is due
}

func newEnder(d *Dispatcher) *ender {
	return &ender{d: d, pending: map[uint16][]claims.End{}, kick: make(chan struct{}, 1)}
}

// add queues the end of one task's claim.
func (e *ender) add(p uint16, end claims.End) {
	e.mu.Lock()
	e.pending[p] = append(e.pending[p], end)
	e.mu.Unlock()
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// endLinger is how long the ender collects ends before a round. Workers'
// completions and aborts end their claims in the same Raft entry that
// decides them (OpAct); what comes here is rarer (cancels learned from
// replicas, the node's own aborts, tasks found terminal on a path that
// acts on a claim), so the window is short: until the end is in, the
// group could grant a task a replica other than its next leader knows
// is cancelled.
const endLinger = 10 * time.Millisecond

// run proposes queued ends until stop is closed, then proposes what is left.
func (e *ender) run(stop <-chan struct{}) {
	linger := time.NewTimer(0)
	<-linger.C
	for {
		select {
		case <-e.kick:
			linger.Reset(endLinger)
			select {
			case <-linger.C:
			case <-stop:
			}
			e.round()
		case <-stop:
			e.round()
			return
		}
	}
}

// round proposes everything queued, one entry per partition, concurrently,
// and waits for them.
func (e *ender) round() {
	e.mu.Lock()
	batch := e.pending
	e.pending = map[uint16][]claims.End{}
	e.mu.Unlock()
	var wg sync.WaitGroup
	for p, ends := range batch {
		wg.Go(func() {
			cmd := &claims.Command{Op: claims.OpEnd, NowMs: e.d.cfg.Clock.Now().UnixMilli(), Ends: ends}
			g := e.d.host.Group(p)
			if g == nil || !g.IsLeader() {
				return // the leader ends them when the terminal states reach it
			}
			outs, err := g.Propose(cmd, replicas.ProposeTimeout)
			if err != nil {
				e.d.cfg.Logger.Warn("ending claims failed; the monitor ends them at expiry", "partition", p, "tasks", len(ends), "err", err)
				return
			}
			for _, o := range outs {
				if o.Err != nil && !errors.Is(o.Err, claims.ErrTaskTerminal) {
					e.d.cfg.Logger.Warn("ending a claim failed", "id", o.ID, "err", o.Err)
				}
			}
		})
	}
	wg.Wait()
}
