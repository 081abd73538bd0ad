package server

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
)

// importClock is the importing node's clock in these tests.
type importClock struct{ t time.Time }

func (c importClock) Now() time.Time { return c.t }

// TestImportFromAPI checks the state an imported task becomes, built
// from the line alone, and the refusals naming their field.
func TestImportFromAPI(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	sv := New(Config{Limits: crdt.DefaultLimits, Clock: importClock{now}})
	ms := func(d time.Duration) int64 { return now.Add(d).UnixMilli() }
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	spec := &nornv1.TaskSpec{Queue: "q", Priority: 2, Payload: []byte("p")}
	cspec := &crdt.Spec{Queue: "q", Priority: 2, Payload: []byte("p"), CreatedAt: crdt.Timestamp{WallMs: ms(-time.Hour)}}
	updates := []*nornv1.TaskUpdate{
		{ClaimId: 9, Seq: 2, At: ts(-20 * time.Minute), Progress: 0.7},
		{ClaimId: 9, Seq: 1, At: ts(-30 * time.Minute), Progress: 0.5, Message: "half", Data: []byte("ckpt")},
	}
	cupdates := []crdt.Update{
		{Claim: 9, Seq: 1, At: crdt.Timestamp{WallMs: ms(-30 * time.Minute)}, Progress: 0.5, Message: "half", Data: []byte("ckpt")},
		{Claim: 9, Seq: 2, At: crdt.Timestamp{WallMs: ms(-20 * time.Minute)}, Progress: 0.7},
	}
	good := []struct {
		name string
		in   *nornv1.Task
		want *crdt.Task
	}{
		{"completed", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_COMPLETED,
			FinishedAt: ts(-10 * time.Minute), UpdatedAt: ts(-5 * time.Minute), Result: []byte("r"), Updates: updates},
			&crdt.Task{ID: 7, Spec: cspec, Updates: cupdates, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: ms(-10 * time.Minute)},
				Kind: crdt.Completed, Claim: ImportClaimID, Result: []byte("r")}}}},
		{"aborted at updatedAt", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_ABORTED,
			UpdatedAt: ts(-5 * time.Minute), Errors: []*nornv1.TaskError{{Code: "c", Args: []string{"a"}}}},
			&crdt.Task{ID: 7, Spec: cspec, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: ms(-5 * time.Minute)},
				Kind: crdt.Aborted, Claim: ImportClaimID, Errors: []crdt.TaskError{{Code: "c", Args: []string{"a"}}}}}}},
		{"cancelled", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_CANCELLED, FinishedAt: ts(-time.Minute)},
			&crdt.Task{ID: 7, Spec: cspec, Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: ms(-time.Minute)}, Kind: crdt.Cancelled}}}},
		{"claimed: the spec alone", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_CLAIMED,
			Updates: updates, Progress: 0.7, CurrentClaim: &nornv1.ClaimInfo{ClaimId: 9}},
			&crdt.Task{ID: 7, Spec: cspec}},
		{"no status: the spec alone", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour)}, &crdt.Task{ID: 7, Spec: cspec}},
		{"dead: the attempts' errors as one failure", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_DEAD,
			FinishedAt: ts(-time.Minute), Errors: []*nornv1.TaskError{{Code: "boom", Attempt: 1}, {Code: "lease_expired", Attempt: 2}, {Code: "max_attempts_exceeded", Args: []string{"2"}}}},
			&crdt.Task{ID: 7, Spec: cspec,
				Terminals: []crdt.Terminal{{At: crdt.Timestamp{WallMs: ms(-time.Minute)}, Kind: crdt.Dead, Claim: ImportClaimID,
					Errors: []crdt.TaskError{{Code: "max_attempts_exceeded", Args: []string{"2"}}}}},
				Failures: []crdt.Failure{{Claim: ImportClaimID, At: crdt.Timestamp{WallMs: ms(-time.Hour)},
					Errors: []crdt.TaskError{{Code: "boom"}, {Code: "lease_expired"}}}}}},
		{"delayed after a failed attempt", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_DELAYED,
			Errors: []*nornv1.TaskError{{Code: "boom", Attempt: 1}}},
			&crdt.Task{ID: 7, Spec: cspec, Failures: []crdt.Failure{{Claim: ImportClaimID, At: crdt.Timestamp{WallMs: ms(-time.Hour)},
				Errors: []crdt.TaskError{{Code: "boom"}}}}}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sv.importFromAPI("tasks[0]", tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			again, _ := sv.importFromAPI("tasks[0]", tc.in)
			if again.Digest() != got.Digest() {
				t.Errorf("the same line made two different states")
			}
		})
	}

	bad := []struct {
		name  string
		in    *nornv1.Task
		code  connect.Code
		field string
	}{
		{"no id", &nornv1.Task{Spec: spec, CreatedAt: ts(-time.Hour)}, connect.CodeInvalidArgument, "tasks[0].id"},
		{"no spec", &nornv1.Task{Id: 7, CreatedAt: ts(-time.Hour)}, connect.CodeInvalidArgument, "tasks[0].spec"},
		{"bad queue", &nornv1.Task{Id: 7, Spec: &nornv1.TaskSpec{Queue: "a b"}, CreatedAt: ts(-time.Hour)}, connect.CodeInvalidArgument, "tasks[0].spec.queue"},
		{"no createdAt", &nornv1.Task{Id: 7, Spec: spec}, connect.CodeInvalidArgument, "tasks[0].createdAt"},
		{"createdAt ahead", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(2 * time.Minute)}, connect.CodeInvalidArgument, "tasks[0].createdAt"},
		{"createdAt before 1970", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: timestamppb.New(time.Unix(-5, 0))}, connect.CodeInvalidArgument, "tasks[0].createdAt"},
		{"unknown status", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: 42}, connect.CodeInvalidArgument, "tasks[0].status"},
		{"terminal without a time", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_CANCELLED}, connect.CodeInvalidArgument, "tasks[0].finishedAt"},
		{"result of an abort", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_ABORTED, FinishedAt: ts(-time.Minute),
			Errors: []*nornv1.TaskError{{Code: "c"}}, Result: []byte("r")}, connect.CodeInvalidArgument, "tasks[0].result"},
		{"errors of a completion", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_COMPLETED, FinishedAt: ts(-time.Minute),
			Errors: []*nornv1.TaskError{{Code: "c"}}}, connect.CodeInvalidArgument, "tasks[0].errors"},
		{"error without a code", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_ABORTED, FinishedAt: ts(-time.Minute),
			Errors: []*nornv1.TaskError{{Description: "d"}}}, connect.CodeInvalidArgument, "tasks[0].errors[0].code"},
		{"result too large", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_COMPLETED, FinishedAt: ts(-time.Minute),
			Result: make([]byte, crdt.DefaultLimits.MaxPayloadBytes+1)}, connect.CodeInvalidArgument, "tasks[0].result"},
		{"update progress", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_CANCELLED, FinishedAt: ts(-time.Minute),
			Updates: []*nornv1.TaskUpdate{{ClaimId: 9, Seq: 1, At: ts(-time.Hour), Progress: 2}}}, connect.CodeInvalidArgument, "tasks[0].updates[0].progress"},
		{"update without claim", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_CANCELLED, FinishedAt: ts(-time.Minute),
			Updates: []*nornv1.TaskUpdate{{Seq: 1, At: ts(-time.Hour)}}}, connect.CodeInvalidArgument, "tasks[0].updates[0].claimId"},
		{"update repeated", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Status: nornv1.TaskStatus_TASK_STATUS_CANCELLED, FinishedAt: ts(-time.Minute),
			Updates: []*nornv1.TaskUpdate{{ClaimId: 9, Seq: 1, At: ts(-time.Hour)}, {ClaimId: 9, Seq: 1, At: ts(-time.Hour)}}}, connect.CodeInvalidArgument, "tasks[0].updates[1]"},
		{"result of a ready task", &nornv1.Task{Id: 7, Spec: spec, CreatedAt: ts(-time.Hour), Result: []byte("r")}, connect.CodeInvalidArgument, "tasks[0].result"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sv.importFromAPI("tasks[0]", tc.in)
			if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("err = %v, want %v naming %q", err, tc.code, tc.field)
			}
		})
	}
}
