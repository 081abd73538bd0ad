// Package client is the Go client of Norn, a distributed task store: it
// enqueues, reads, claims and settles tasks over the node API
// (norn.v1.TaskService, AdminService.Status), retrying what is safe to
// retry, and runs workers.
//
// # Use
//
// Make one Client per process (it is safe for concurrent use) and close it
// at the end:
//
//	c, err := client.New("127.0.0.1:7400")
//	if err != nil { ... }
//	defer c.Close()
//
//	id, err := c.Enqueue(ctx, &nornv1.TaskSpec{Queue: "emails", Payload: body})
//
// To work on a queue, give a Worker a Handler and Run it until shutdown:
//
//	w, err := client.NewWorker(c, client.WorkerConfig{
//		Queue:       "emails",
//		Concurrency: 8,
//		Handler: func(ctx context.Context, t *client.Task) ([]byte, error) {
//			return nil, send(ctx, t.Payload)
//		},
//	})
//	if err != nil { ... }
//	err = w.Run(ctx) // returns after ctx is done and the held tasks are settled
//
// Any node answers any call. New takes one address ("host:port",
// "http://host:port" or "https://host:port") or several separated by
// commas, and speaks the gRPC protocol over HTTP/2, in cleartext (h2c)
// unless the scheme is https; in cleartext the hot calls (Enqueue, Claim,
// Complete, Renew and their batches) travel as framed calls on the same
// port, which cost both ends less (WithFramedCalls). Requests and
// responses are the generated messages of package nornv1;
// Client.TaskService gives the raw connect client of one node for anything
// this package does not wrap.
//
// # Nodes
//
// The addresses given to New are seeds: the client asks a node it knows
// for the cluster's nodes (AdminService.Status) after its first call,
// every 30 s (WithDiscovery), and at once when a connection to a node
// fails. It sends to the seeds, which it always keeps, and to every node
// listed as alive or suspect; Endpoints lists them. Calls (coalesced
// batches included) go to the nodes in turn.
//
// A node is skipped for a while when an attempt shows it down: the
// connection was refused, reset or timed out, the name did not resolve,
// HTTP/2 gave up on the request, or the node answered UNAVAILABLE without
// a WriteFailure detail. It is skipped for 1 s after the first such
// failure, doubling with each failure in a row up to 30 s; any other
// answer of the node ends it. An UNAVAILABLE with a WriteFailure (a write
// quorum missed) does not count against the node, nor does an attempt cut
// short by its context (a node that accepts connections but never answers
// is not detected: such calls end at their deadline). When every node is
// being skipped, a call still goes to the one that failed longest ago.
// Spreading and failover change where an attempt goes, never what is
// retried: a retried attempt goes to another node when one is healthy, by
// the rules below.
//
// # Errors
//
// Every error keeps its connect code (connect.CodeOf(err), errors.As to
// *connect.Error) and matches the sentinel of its code with errors.Is:
// ErrNotFound, ErrSuperseded (FAILED_PRECONDITION: the claim has ended or
// the task is terminal, for example cancelled), ErrUnavailable,
// ErrInvalidArgument, ErrAlreadyExists, ErrResourceExhausted. IsSuperseded,
// IsNotFound and IsUnavailable test the code directly. WriteFailureOf reads
// the WriteFailure detail of an UNAVAILABLE write.
//
// # Retries
//
// A call is retried with exponential backoff and jitter (RetryPolicy;
// default 5 attempts, 50 ms doubling to at most 2 s), within its context's
// deadline or else the client's timeout (WithTimeout, default 10 s):
//
//   - Reads (GetTask, ListTasks, CountTasks, Status) and the idempotent
//     writes (Renew, Update, Complete, Abort, Cancel, Yield) retry
//     UNAVAILABLE and DEADLINE_EXCEEDED. Writes are CRDT merges keyed by
//     task id (and claim id, update seq), so a repeat does no harm. A
//     repeated Yield whose first attempt took effect reports ErrSuperseded.
//   - The calls on a claim (Renew, Update, Complete, Abort, Yield) are
//     decided by the task's partition leader, and a partition is without
//     one for one to three seconds when its leader fails. So they retry
//     past the policy's attempts for as long as the claim's lease lasts,
//     as the client last learned it (from Claim, then each Renew), within
//     the call's deadline; once the lease is over, the attempts alone
//     bound them. The Worker completes or aborts with its lease as the
//     deadline: a result is not thrown away because of a failover.
//   - Enqueue and EnqueueBatch retry with the same ids: with ids the
//     caller gave (WithID, WithIDs), any UNAVAILABLE or DEADLINE_EXCEEDED;
//     without, only an UNAVAILABLE carrying a nornv1.WriteFailure detail,
//     and then with the ids it names. The client never makes ids, and never
//     resends an id-less enqueue whose fate is unknown, so a retry cannot
//     create a second task. A failed call whose ids are known returns them
//     with the error.
//   - Claim is not idempotent (a repeated claim would take more tasks, and
//     the first ones would sit claimed until their leases expire), so it is
//     retried only when the request provably never reached a node: the
//     connection was refused or the host name did not resolve, or the node
//     refused it unread for want of room (RESOURCE_EXHAUSTED "... retry
//     later", docs/API.md "Limits"). Every other call retries those too.
//
// # Batching
//
// A node serves about 20,000 single-item calls per second but about a
// million tasks per second in batches of 100, so concurrent Enqueue calls
// share EnqueueBatch RPCs and concurrent Complete calls share
// CompleteBatch RPCs. Each caller gets its own id (an id given with WithID
// is kept) and its own error: a batch of enqueues that fails for what may
// be one bad task (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ALREADY_EXISTS) is
// sent again task by task; a stale claim in a batch of completes fails
// alone, with ErrSuperseded, and a batch that fails as a whole is retried
// as a whole, as completes are idempotent. A caller whose context ends
// while its call waits for a batch is left out of it if the batch has not
// been sent yet. Calls with different write quorums, and completes whose
// claims name different leaders, never share a batch.
//
// By default the client batches while in flight: a call goes out at once,
// alone, unless four calls of its kind (and quorum, and leader) are in
// flight; the calls made meanwhile go together as soon as one of them
// returns. A few callers wait for nothing (8 workers completing one task
// at a time each: about 2,800 tasks per second against 2,100 when the
// second call already waited for the first), and the busier the node,
// the larger the batches: on a 3-node cluster, 256 goroutines calling
// Enqueue store about 28,000 tasks per second so, against 7,700 with
// every Enqueue on its own (docs/BENCHMARKS.md).
//
// WithEnqueueBatching(linger, maxBatch) and WithCompleteBatching(linger,
// maxBatch) with a linger instead hold a batch open for linger after its
// first call, or until it holds maxBatch calls (or 2 MiB): larger batches
// for producers with hundreds of goroutines (time.Millisecond and 500 is a
// good start) and workers with many handlers, at the price of up to linger
// on every call. A linger of 0 and maxBatch 1 turn batching off.
//
// # Worker
//
// Worker.Run claims up to the free slots of WorkerConfig.Concurrency in one
// long-polling Claim, runs the Handler of each task in its own goroutine,
// and renews each lease about every Lease/3 while the handler runs. The
// handler's context is cancelled when:
//
//   - a Renew (or a Task.Update) fails with ErrSuperseded: the claim was
//     superseded or the task was cancelled (context.Cause is that error);
//   - no renew succeeded before the lease ran out by the worker's own clock,
//     counted from when the Claim was sent (cause ErrLeaseExpired);
//   - Run's context is done (cause ErrShutdown).
//
// When the handler returns, the worker settles the claim:
//
//   - nil error: Complete with the result (also during shutdown);
//   - after the claim was reported ended: nothing;
//   - an error after the worker cancelled the handler's context, or an
//     error wrapping ErrYield: Yield, with the last progress reported;
//   - an error wrapped in Permanent: Abort (the task is ABORTED for good);
//   - any other error: Fail, a failed attempt: the task is retried after
//     its backoff (TaskSpec.retry, or the server's default policy), or is
//     DEAD after its last attempt;
//   - the abort's or failure's error is the *TaskError the handler's error
//     wraps (its code, description and args), or else code
//     CodeHandlerError and the error's text; a panic fails the attempt
//     with CodeHandlerPanic and the stack, and the worker carries on. (A
//     panic in a goroutine the handler started still crashes the
//     process.)
//
// A failed settle is logged; the lease then expires and the task is
// claimed again (delivery is at least once, so handlers should be
// idempotent). Task.Progress and Task.Update report progress with
// increasing sequence numbers.
//
// On shutdown Run stops claiming (a claim in flight is abandoned: tasks it
// was granted wait for their lease to expire), cancels the handlers'
// contexts, waits for every handler to return (a handler that ignores its
// context holds Run up) and settles its task as above, so the tasks still
// held are yielded back at once. Then Run returns.
package client
