// Package check is the pure half of Norn's Jepsen harness: the record of a
// run (its history of operations) and the checkers that judge it. It
// starts no process and opens no connection: its inputs are operations
// already recorded and Status answers already read, its outputs are
// verdicts. The runner, the cluster, the nemeses and the workload are in
// package jepsen, which feeds this one; `go test ./jepsen/check` runs the
// checkers' own tests (hand-made histories) without root.
//
// # The history
//
// An Op is one completed client operation: which porcupine process
// (Process) and workload client made it, the function (enqueue, claim,
// renew, complete, yield, cancel, read), the task, claim, lease and write
// quorum involved, and its outcome: Type "ok", "fail" (a definite refusal:
// it did not happen) or "info" (indeterminate: it may have happened).
// Call and Return are nanoseconds on the harness's monotonic clock since
// the run started; an info op returns at +infinity (Return -1, Ret).
//
// A History records the ops as the clients complete them. It owns the
// run's clock (Now), hands out porcupine process ids (NewProcess: a client
// takes a new one after an info op), numbers the ops as they are added
// (Add), lets the aimed nemeses watch them as they come (Subscribe) and
// the runner wait for the first successful ones (WaitOK). Ops returns
// them in call order, the order every checker expects. WriteJSONLines
// writes them to a run's history.jsonl, one op per line; ReadHistory
// reads such a file back.
//
// # The checkers
//
// Each checker takes the ops (and what else it needs: the replication
// factor N, the final reads, the times of the first fault and the heal)
// and returns a Verdict: the checker's name, whether it passed, counts,
// and the first 20 anomalies in words (Addf). A scenario may mark a
// checker ReportOnly (its faults go beyond the promise the checker
// tests): Status then says "reported" instead of "FAIL". Summary formats
// a run's verdicts as one row of the runner's table.
//
//   - Linearizable: porcupine over each task's claim-path ops, against a
//     nondeterministic model of one task (claim ids increase, one live
//     long claim at a time, no claim of a terminal task, ...), partitioned
//     by task id; on failure it names the failing tasks, writes
//     linearizability.html, and says whether the anomaly is only spurious
//     refusals.
//   - Queue: Jepsen's total queue: no acked enqueue lost, nothing
//     delivered that was never enqueued (with the R=N final reads of the
//     acked tasks never delivered).
//   - Exclusion: no two claims of a short-lease task overlap, from the
//     holder's conservative view of its lease.
//   - Terminal: no claim after a complete or cancel acked by every
//     replica.
//   - Liveness: enough successful ops before the first fault, a claim
//     soon after the heal.
//   - PlacementProblems: the membership-churn scenario's judgement of the
//     active nodes' Status answers (one ring epoch, no move under way,
//     every partition on exactly its cohort of N active members with a
//     leader among them, the drained and decommissioned nodes as the
//     nemesis left them: PlacementExpect).
//
// # How a scenario feeds it
//
// jepsen.Run creates the History; the workload's clients Add every op
// (the drain's too) while the nemesis injects faults. After the heal and
// the drain, Run reads the acked tasks never delivered with R=N and
// passes h.Ops() to Linearizable, Queue, Exclusion, Terminal and
// Liveness; the checkers that must read the live cluster (convergence,
// placement) poll it in package jepsen and build their Verdicts there,
// placement through PlacementProblems. The verdicts go to the run's
// result.json and verdicts.json. `norn-jepsen --check <results dir>`
// runs Linearizable, Exclusion and Terminal again on a saved
// history.jsonl (ReadHistory).
package check
