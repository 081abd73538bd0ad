package server

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/cluster"
)

// deadlineFromAPI validates a TaskSpec.deadline (field names it): a
// valid time in the future on this node's clock (one already past would
// cancel the task at once: a mistake, not a task), unless imported (an
// exported task keeps its deadline: one past it that had not ended is
// cancelled at once). It must be after the spec's not-before time too,
// which crdt.Spec.Validate checks. Deadlines are refused while a ring
// member lacks them (deadlinesGate).
func (sv *Server) deadlineFromAPI(field string, dl *timestamppb.Timestamp, imported bool) (int64, error) {
	if err := dl.CheckValid(); err != nil {
		return 0, apierr.Invalid(field, "%v", err)
	}
	ms := dl.AsTime().UnixMilli()
	if ms <= 0 {
		return 0, apierr.Invalid(field, "must be after 1970")
	}
	if now := sv.cfg.Clock.Now(); ms <= now.UnixMilli() && !imported {
		return 0, apierr.Invalid(field, "%s is not in the future (now %s): the task would be cancelled at once",
			dl.AsTime().UTC().Format("2006-01-02T15:04:05.000Z"), now.UTC().Format("2006-01-02T15:04:05.000Z"))
	}
	return ms, sv.deadlinesGate(field)
}

// deadlinesGate refuses deadlines (FAILED_PRECONDITION naming field)
// while a ring member has not said it applies them
// (cluster.FeatureDeadlines): a node of an older build cannot decode a
// task with a deadline, nor the claim FSM entries that carry one.
func (sv *Server) deadlinesGate(field string) error {
	return sv.featureGate(field, cluster.FeatureDeadlines, "deadlines")
}
