package server

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
)

// The edge's validation alone, on a Server with no parts: every refusal is
// INVALID_ARGUMENT (sizes too: not retryable) and names its field.
func TestSpecFromAPI(t *testing.T) {
	sv := New(Config{Limits: crdt.DefaultLimits, Clock: crdt.SystemClock{}})
	big := make([]byte, crdt.DefaultLimits.MaxPayloadBytes+1)
	for _, tc := range []struct {
		name  string
		spec  *nornv1.TaskSpec
		code  connect.Code // 0: accepted
		field string
	}{
		{"ok", &nornv1.TaskSpec{Queue: "q", Priority: 3, Payload: []byte("x")}, 0, ""},
		{"not before", &nornv1.TaskSpec{Queue: "q", NotBefore: timestamppb.New(time.UnixMilli(1700000000000))}, 0, ""},
		{"missing", nil, connect.CodeInvalidArgument, "task"},
		{"no queue", &nornv1.TaskSpec{}, connect.CodeInvalidArgument, "task.queue"},
		{"bad queue", &nornv1.TaskSpec{Queue: "a b"}, connect.CodeInvalidArgument, "task.queue"},
		{"bad not before", &nornv1.TaskSpec{Queue: "q", NotBefore: &timestamppb.Timestamp{Nanos: -1}}, connect.CodeInvalidArgument, "task.notBefore"},
		{"payload too large", &nornv1.TaskSpec{Queue: "q", Payload: big}, connect.CodeInvalidArgument, "task.payload"},
		{"deadline", &nornv1.TaskSpec{Queue: "q", Deadline: timestamppb.New(time.Now().Add(time.Hour))}, 0, ""},
		{"deadline past", &nornv1.TaskSpec{Queue: "q", Deadline: timestamppb.New(time.Now().Add(-time.Hour))}, connect.CodeInvalidArgument, "task.deadline"},
		{"deadline before 1970", &nornv1.TaskSpec{Queue: "q", Deadline: timestamppb.New(time.UnixMilli(-5))}, connect.CodeInvalidArgument, "task.deadline"},
		{"bad deadline", &nornv1.TaskSpec{Queue: "q", Deadline: &timestamppb.Timestamp{Nanos: -1}}, connect.CodeInvalidArgument, "task.deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := sv.specFromAPI("task", tc.spec, false)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if spec.Queue != tc.spec.Queue || spec.Priority != tc.spec.Priority {
					t.Fatalf("spec %+v from %v", spec, tc.spec)
				}
				return
			}
			if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("err = %v, want %v naming %q", err, tc.code, tc.field)
			}
		})
	}
}

func TestLeaseArg(t *testing.T) {
	sv := New(Config{DefaultLease: 30 * time.Second, MaxLease: time.Hour})
	if l, err := sv.leaseArg("lease", nil); err != nil || l != 30*time.Second {
		t.Fatalf("no lease: %v, %v; want the default", l, err)
	}
	if l, err := sv.leaseArg("lease", durationpb.New(time.Minute)); err != nil || l != time.Minute {
		t.Fatalf("1m: %v, %v", l, err)
	}
	for _, d := range []time.Duration{0, -time.Second, time.Microsecond, 2 * time.Hour} {
		if _, err := sv.leaseArg("lease", durationpb.New(d)); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "lease:") {
			t.Errorf("lease %v: %v, want INVALID_ARGUMENT naming lease", d, err)
		}
	}
}
