package check

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// CountsObservation is what the counts checker read from the healed,
// drained cluster.
type CountsObservation struct {
	// Replicas holds, per partition and node, the task counts by status
	// of that node's replica (AdminService.Status).
	Replicas map[uint32]map[string]map[string]uint64
	// Counted is CountTasks over the whole cluster, asked of one node.
	Counted map[string]uint64
	// Listed tallies the statuses of every task ListTasks pages through,
	// asked of the same node.
	Listed map[string]uint64
}

// CountsProblems judges an observation against the history: every
// replica of a partition counts the same; the counters (CountTasks)
// equal the stored tasks (ListTasks scans them); no acknowledged enqueue
// is missing from the total and nothing is counted that was never
// enqueued; every task with an acknowledged complete or cancel is
// counted as ended.
func CountsProblems(ops []*Op, obs CountsObservation) []string {
	var out []string
	parts := slices.Sorted(maps.Keys(obs.Replicas))
	for _, p := range parts {
		nodes := obs.Replicas[p]
		ids := slices.Sorted(maps.Keys(nodes))
		for _, id := range ids[1:] {
			if !maps.Equal(nodes[id], nodes[ids[0]]) {
				var s []string
				for _, id := range ids {
					s = append(s, id+"="+formatCounts(nodes[id]))
				}
				out = append(out, fmt.Sprintf("partition %d: replicas count differently: %s", p, strings.Join(s, " ")))
				break
			}
		}
	}
	if !maps.Equal(obs.Counted, obs.Listed) {
		out = append(out, fmt.Sprintf("CountTasks %s, the tasks listed %s", formatCounts(obs.Counted), formatCounts(obs.Listed)))
	}
	attempted := map[string]bool{}
	acked := map[uint64]bool{}
	ended := map[uint64]bool{}
	revived := map[uint64]bool{} // a Retry may have made them live again
	for _, o := range ops {
		if o.F == "retry" && o.Type != "fail" {
			revived[o.Task] = true
		}
	}
	for _, o := range ops {
		switch {
		case o.F == "enqueue" && o.Type != "fail":
			attempted[o.Payload] = true
			if o.Type == "ok" {
				acked[o.Task] = true
			}
		case (o.F == "complete" || o.F == "cancel") && o.Type == "ok" && !revived[o.Task]:
			ended[o.Task] = true
		}
	}
	var total, terminal uint64
	for st, n := range obs.Counted {
		total += n
		if st == "COMPLETED" || st == "CANCELLED" || st == "ABORTED" || st == "DEAD" {
			terminal += n
		}
	}
	if total < uint64(len(acked)) {
		out = append(out, fmt.Sprintf("%d tasks counted, %d enqueues acknowledged", total, len(acked)))
	}
	if total > uint64(len(attempted)) {
		out = append(out, fmt.Sprintf("%d tasks counted, only %d enqueues attempted", total, len(attempted)))
	}
	if terminal < uint64(len(ended)) {
		out = append(out, fmt.Sprintf("%d tasks counted as ended, %d had a complete or cancel acknowledged", terminal, len(ended)))
	}
	return out
}

// formatCounts renders counts by status in a stable order.
func formatCounts(c map[string]uint64) string {
	var s []string
	for k, v := range c {
		s = append(s, fmt.Sprintf("%s:%d", k, v))
	}
	sort.Strings(s)
	return "{" + strings.Join(s, " ") + "}"
}
