package server

import (
	"testing"

	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/transport"
)

// FuzzRequestDecoders feeds every request message of TaskService and
// AdminService, as protobuf and as JSON, through the decoders the API
// uses (proto.Unmarshal, transport.StrictJSON) and the edge's checks
// (callScope; specFromAPI for the task specs). No input may panic, and a
// spec the edge accepts must store as a task state that reads back the
// same (crdt encoding).
func FuzzRequestDecoders(f *testing.F) {
	for _, m := range []proto.Message{
		&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "q", Priority: 3, Payload: []byte("x"), DependsOn: []uint64{1}}},
		&nornv1.EnqueueBatchRequest{Tasks: []*nornv1.TaskSpec{{Queue: "a"}, {Queue: "b"}}},
		&nornv1.ClaimRequest{Queue: "q", Worker: "w", Max: 16},
		&nornv1.CompleteBatchRequest{Completions: []*nornv1.CompleteRequest{{Id: 1, ClaimId: 2, Result: []byte("r")}}},
		&nornv1.UpdateRequest{Id: 1, ClaimId: 2, Seq: 1, Progress: 0.5, Message: "m"},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte(`{"task": {"queue": "q", "priority": 5, "payload": "eA=="}}`))
	f.Add([]byte(`{"task": {"queue": "q", "priorty": 5}}`))
	f.Add([]byte(`{"queue": "q", "worker": "w", "max": 1000}`))
	f.Add([]byte(`{"completions": [{"id": "1", "claimId": "2"}]}`))
	f.Add([]byte(`{"task": {"queue": "q", "deadline": "2999-01-01T00:00:00Z"}}`))
	sv := New(Config{Limits: crdt.DefaultLimits, Clock: crdt.SystemClock{}})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newMsg := range requestTypes {
			for _, decode := range []func([]byte, proto.Message) error{
				func(b []byte, m proto.Message) error { return proto.Unmarshal(b, m) },
				func(b []byte, m proto.Message) error { return transport.UnmarshalStrictJSON(b, m) },
			} {
				m := newMsg()
				if decode(data, m) != nil {
					continue
				}
				callScope(m)
				var specs []*nornv1.TaskSpec
				switch r := m.(type) {
				case *nornv1.EnqueueRequest:
					specs = []*nornv1.TaskSpec{r.GetTask()}
				case *nornv1.EnqueueBatchRequest:
					specs = r.GetTasks()
				}
				for _, s := range specs {
					spec, err := sv.specFromAPI("task", s, false)
					if err != nil {
						continue
					}
					task := &crdt.Task{ID: 1, Spec: spec}
					back, err := crdt.Decode(task.Encode())
					if err != nil {
						t.Fatalf("an accepted spec %+v does not read back: %v", spec, err)
					}
					if !sameSpec(back.Spec, spec) {
						t.Fatalf("an accepted spec reads back changed: %+v, stored %+v", back.Spec, spec)
					}
				}
			}
		}
	})
}

// requestTypes makes an empty message of every request type.
var requestTypes = []func() proto.Message{
	func() proto.Message { return new(nornv1.EnqueueRequest) },
	func() proto.Message { return new(nornv1.EnqueueBatchRequest) },
	func() proto.Message { return new(nornv1.GetTaskRequest) },
	func() proto.Message { return new(nornv1.ListTasksRequest) },
	func() proto.Message { return new(nornv1.CountTasksRequest) },
	func() proto.Message { return new(nornv1.ClaimRequest) },
	func() proto.Message { return new(nornv1.RenewRequest) },
	func() proto.Message { return new(nornv1.UpdateRequest) },
	func() proto.Message { return new(nornv1.CompleteRequest) },
	func() proto.Message { return new(nornv1.CompleteBatchRequest) },
	func() proto.Message { return new(nornv1.AbortRequest) },
	func() proto.Message { return new(nornv1.YieldRequest) },
	func() proto.Message { return new(nornv1.CancelRequest) },
	func() proto.Message { return new(nornv1.StatusRequest) },
	func() proto.Message { return new(nornv1.JoinRequest) },
	func() proto.Message { return new(nornv1.RebalanceRequest) },
	func() proto.Message { return new(nornv1.DrainRequest) },
	func() proto.Message { return new(nornv1.DecommissionRequest) },
	func() proto.Message { return new(nornv1.RemoveRequest) },
}
