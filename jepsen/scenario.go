package jepsen

import "time"

// Scenario is a named fault schedule with its cluster shape.
type Scenario struct {
	Name  string
	Desc  string
	Nodes int // node slots
	// Initial, when set, is how many nodes form the cluster; the other
	// slots are spares the nemesis starts and joins (ClusterConfig).
	Initial    int
	NeedsHooks bool
	Bugs       []string // seeded bugs: the run must FAIL (self-test)
	Args       []string // more nornd flags
	// Time and Clients, when set, replace the run's: what the scenario
	// needs to show its anomaly.
	Time    time.Duration
	Clients int
	Nemesis Nemesis
	Short   bool // part of jepsen-short
	// EnqueueShare, when set, replaces the workload's (see Workload).
	EnqueueShare float64
	// ShortLease, when set, replaces the workload's short lease (2.5 s).
	ShortLease time.Duration
	// BugMaxClockOffset, when set, is the nodes' -max-clock-offset while
	// the scenario's seeded bugs are on (the clean run keeps the
	// default): a setting only the bug lets a node start with.
	BugMaxClockOffset time.Duration
	// ReportOnly names checkers whose anomalies this scenario reports
	// without failing: the faults go beyond what the promise covers.
	ReportOnly []string
	// UntilNemesis, when set, makes the nemesis a finite sequence: the
	// workload runs until the nemesis returns (and at least the run's
	// time), at most UntilNemesis (the nemesis's context ends then).
	UntilNemesis time.Duration
	// Placement adds the placement checker (CheckPlacement) to the run's
	// verdicts; the nemesis records what it expects in Env.Churn.
	Placement bool
	// Rogue adds the rogue checker (CheckRogue): the nemesis records its
	// attempts in Env.Rogue.
	Rogue bool
	// Priorities runs the workload with priorities (5 of them, enqueues
	// acked by every replica, every claim through n1) and adds the
	// priority checker (check.Priority).
	Priorities bool
	// RetryShare and FailShare, when set, replace the workload's shares
	// of tasks with a retry policy and of fails among the ops on them
	// (retryShare, failShare).
	RetryShare, FailShare float64
	// ReviveShare, when set, replaces the workload's share of Retry ops
	// (reviveShare).
	ReviveShare float64
	// QueueCap, when set, caps the workload's queue at this many tasks
	// claimed at once (QueueService.SetQueue max_claimed) before the
	// workload starts, gives every claim a short lease (a long one
	// abandoned by its client would hold the cap to the end), and adds
	// the cap checker (check.Cap) with the overshoot the docs allow
	// during a fault: the cap again (limits.go).
	QueueCap uint32
	// DeadlineShare, when set, gives that share of the enqueued tasks a
	// deadline deadlineMin to deadlineMax away and adds the deadlines
	// checker (check.Deadlines). Not with Priorities or QueueCap: their
	// checkers see no op for a deadline's cancel.
	DeadlineShare float64
	// QueueRetention, when set, runs the retention clients beside the
	// workload on a queue of their own with this retention (NeedsHooks:
	// the test hooks let it go below an hour) and adds the retention
	// checker (check.Retention; retention.go).
	QueueRetention time.Duration
	// Unique runs the unique-keys clients beside the workload on a queue
	// of their own and adds the unique checker (check.Unique; unique.go).
	Unique bool
	// Schedule creates a schedule ticking every second before the
	// workload and adds the schedule checker (check.Schedule;
	// schedules.go).
	Schedule bool
	// Fair runs the fairness clients beside the workload on a queue of
	// their own and adds the fairness checker (check.Fairness; fair.go).
	Fair bool
}
