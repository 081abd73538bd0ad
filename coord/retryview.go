package coord

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
)

// RetryToAPI is a retry policy as the API shows it; nil for none.
func RetryToAPI(p *crdt.RetryPolicy) *nornv1.RetryPolicy {
	if p == nil {
		return nil
	}
	r := &nornv1.RetryPolicy{MaxAttempts: p.MaxAttempts,
		Multiplier: float64(p.MultiplierMilli) / 1000, Jitter: float64(p.JitterMilli) / 1000}
	if p.InitialMs > 0 {
		r.InitialBackoff = durationpb.New(msDuration(p.InitialMs))
	}
	if p.MaxMs > 0 {
		r.MaxBackoff = durationpb.New(msDuration(p.MaxMs))
	}
	return r
}

// failureErrors is the errors of task t's failed attempts, oldest first
// (by claim), each with its attempt: the claim's seq in rec's history
// (0 when rec does not keep it). An expiry has the error lease_expired.
func failureErrors(t *crdt.Task, rec *claims.Record) []*nornv1.TaskError {
	var out []*nornv1.TaskError
	for _, f := range t.Failures {
		attempt := uint32(0)
		if rec != nil {
			for i := range rec.History {
				if rec.History[i].Token == f.Claim {
					attempt = uint32(rec.History[i].Seq)
				}
			}
		}
		if f.Expired {
			out = append(out, &nornv1.TaskError{Code: claims.CodeLeaseExpired,
				Description: "the worker's lease ran out before it renewed", Attempt: attempt})
		}
		for _, e := range f.Errors {
			out = append(out, &nornv1.TaskError{Code: e.Code, Description: e.Description, Args: e.Args, Attempt: attempt})
		}
		if !f.Expired && len(f.Errors) == 0 {
			out = append(out, &nornv1.TaskError{Code: "failed", Description: "the worker failed the attempt without an error", Attempt: attempt})
		}
	}
	return out
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// Life is the task's current life as this state knows it: its CRDT's
// (crdt.Task.Life) or its claim record's, the later; new terminal events
// are stamped with it.
func (ts *TaskState) Life() uint32 {
	l := ts.Task.Life()
	if ts.Claims != nil {
		l = max(l, ts.Claims.Life)
	}
	return l
}
