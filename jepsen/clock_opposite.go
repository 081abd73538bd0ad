package jepsen

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/norn-dev/norn/jepsen/check"
)

// clockOppositeLease is the short lease of the clock-opposite scenarios:
// long enough that, moved to the fast node a moment after the grant, the
// lease still outlasts the new leader's extension (now + lease grace on
// its clock, 2 × the offset ahead, with -lease-grace 500ms), so the
// expiry is judged on the lease as the slow node stamped it.
const clockOppositeLease = 5 * time.Second

// clockOppositeArgs are the clock-opposite scenarios' nornd flags: a
// short lease grace, so that a new leader's extension does not hide the
// clocks (see clockOppositeLease); no leader balancing, which otherwise
// hands a moved leadership back to the slow node within a second or two,
// before the lease ends (seed 42 of the seeded bug: 10 transfers, no
// early expiry), and would drain the slow node's leaderships as the
// harness moves them.
var clockOppositeArgs = []string{"-lease-grace", "500ms", "-leader-balance=false"}

// nemesisClockOpposite sets two nodes' clocks at opposite offsets just
// inside the max clock offset for the whole run (the slow one at -off,
// the fast one at +off, the third at 0: both in bound, 2 × off apart),
// while workers hold short claims past their leases without renewing (as
// worker-pause); each time a stalled worker starts holding a claim that
// the slow node granted, the harness moves that task's partition
// leadership to the fast node (POST /test/transfer on the slow one), and
// back when the hold ends (no leader balancing in these scenarios: the
// slow node is the one leading the most partitions at the start). The
// lease, stamped on the slow clock, is then taken back on the fast one:
// 2 × off early in real time, which the skew buffer must cover. With
// the buffer above 2 × max offset + the measurement error (the rule
// since issue 41) it does; with the seeded bug skew-one-offset the nodes
// run with a max offset of 9/10 of the buffer (Scenario.BugMaxClockOffset,
// what the old rule took), the clocks are 1.7 buffers apart, and another
// worker is granted the task while the first may still hold it
// (exclusion fails).
func nemesisClockOpposite(ctx context.Context, e *Env) {
	slow := e.C.TopLeader()
	others := e.others(slow)
	fast := others[e.Rng.IntN(len(others))]
	off := e.justInBound()
	e.TL.Log("start", "clock-opposite", fmt.Sprintf("%s offset -%s, %s offset +%s (max clock offset %s, skew buffer %s)",
		slow.ID, off, fast.ID, off, e.C.Cfg.MaxClockOffset, e.C.Cfg.SkewBuffer), errors.Join(slow.SetClock(-off, 1), fast.SetClock(off, 1)))
	e.W.SetOnHold(func(client int, o *check.Op, hold time.Duration) {
		if o.Leader != slow.ID {
			return
		}
		go func() {
			err := slow.TransferLeadership(o.Task, fast.ID)
			e.TL.Log("note", "transfer", fmt.Sprintf("task %d's partition (claim %d, granted by %s, client %d holds it %s) from %s to %s",
				o.Task, o.Claim, slow.ID, client, hold, slow.ID, fast.ID), err)
			if err != nil || !sleep(ctx, hold) {
				return
			}
			e.TL.Log("note", "transfer", fmt.Sprintf("task %d's partition back from %s to %s", o.Task, fast.ID, slow.ID),
				fast.TransferLeadership(o.Task, slow.ID))
		}()
	})
	nemesisWorkerPause(ctx, e)
	e.TL.Log("end", "clock-opposite", slow.ID+", "+fast.ID, errors.Join(slow.SetClock(0, 1), fast.SetClock(0, 1)))
}
