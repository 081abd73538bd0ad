package jepsen

import (
	"context"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// The queue-limits scenario (issue 43): the workload's queue is capped at
// Scenario.QueueCap tasks claimed at once, more clients than that claim
// it, and check.Cap counts the claims surely held at once against the cap
// (plus capOvershoot within the fault windows).

// queueLimitsArgs shorten the lease grace (-lease-grace 2s, from 10 s):
// the claims of clients that gave up on them (an answer lost to a kill)
// hold the cap until they expire, and every change of their partition's
// leader leaves them the grace again, so with the default a leadership
// moved back to the restarted node just before the heal kept the cap
// full, and every claim empty, past the liveness bound (10 s after the
// heal: seed 98526). The grace is what it promises; the scenario is
// about the cap.
var queueLimitsArgs = []string{"-lease-grace", "2s"}

// capSettle is how long after a fault ends claims granted during it may
// still be held: a client holds a claim for a few of its ops, renewing
// short leases meanwhile.
const capSettle = 10 * time.Second

// setQueueCap caps the workload's queue before the workload starts, and
// waits until every node applies the cap (SetQueue names none pending).
func setQueueCap(ctx context.Context, c *Cluster, limit uint32) error {
	return setQueue(ctx, c, Queue, &nornv1.QueueSettings{MaxClaimed: &limit})
}

// setQueue sets queue's settings before the workload starts, and waits
// until every node applies them (SetQueue names none pending).
func setQueue(ctx context.Context, c *Cluster, queue string, settings *nornv1.QueueSettings) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for i := 0; time.Now().Before(deadline); i++ {
		n := c.Active()[i%len(c.Active())]
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := n.Queues.SetQueue(cctx, connect.NewRequest(&nornv1.SetQueueRequest{Queue: queue, Settings: settings}))
		cancel()
		switch {
		case err != nil:
			last = err
		case len(resp.Msg.GetPendingNodes()) > 0:
			last = fmt.Errorf("not yet applied on %s", strings.Join(resp.Msg.GetPendingNodes(), ", "))
		default:
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("jepsen: set queue %s to %v: %w", queue, settings, last)
}

// faultWindows are the times from each fault's start to its end plus
// settle (a fault without an end runs to the end of time).
func faultWindows(events []Event, settle time.Duration) [][2]int64 {
	var out [][2]int64
	for i, e := range events {
		if e.Kind != "start" {
			continue
		}
		end := int64(1<<62 - 1)
		for _, f := range events[i+1:] {
			if f.Kind == "end" && f.Fault == e.Fault {
				end = f.T + int64(settle)
				break
			}
		}
		out = append(out, [2]int64{e.T, end})
	}
	return out
}
