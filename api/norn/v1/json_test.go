package nornv1_test

// The JSON contract curl users see. The Connect protocol encodes messages
// with protojson: MarshalOptions{} (zero values omitted) and
// UnmarshalOptions{DiscardUnknown: true}. These tests use the same options,
// and one test goes through a real Connect handler over HTTP.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// Connect's JSON options.
var (
	marshal   = protojson.MarshalOptions{}
	unmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// bigID does not fit a float64 exactly: JSON numbers would corrupt it,
// which is why uint64 fields are JSON strings.
const bigID uint64 = 1<<63 + 12345

func sampleTask() *nornv1.Task {
	at := timestamppb.New(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	claim := &nornv1.ClaimInfo{ClaimId: 77, Seq: 1, Worker: "w1", Start: at, Expiry: at}
	return &nornv1.Task{
		Id: bigID,
		Spec: &nornv1.TaskSpec{
			Queue:     "emails",
			Priority:  -3,
			Payload:   []byte("hi"),
			NotBefore: at,
			DependsOn: []uint64{bigID - 1, 2},
			MaxClaims: 5,
		},
		Status:       nornv1.TaskStatus_TASK_STATUS_CLAIMED,
		Progress:     0.5,
		CreatedAt:    at,
		UpdatedAt:    at,
		CurrentClaim: claim,
		Claims:       []*nornv1.ClaimInfo{claim},
		Updates:      []*nornv1.TaskUpdate{{ClaimId: 77, Seq: 1, At: at, Progress: 0.5, Message: "half"}},
	}
}

func TestTaskJSONNamesAndIDs(t *testing.T) {
	b, err := marshal.Marshal(sampleTask())
	if err != nil {
		t.Fatal(err)
	}
	// protojson's output is deliberately unstable in whitespace, so decode
	// it generically and look at the values.
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if got, want := m["id"], "9223372036854788153"; got != want {
		t.Errorf(`"id" = %#v, want the string %q`, got, want)
	}
	if got, want := m["status"], "TASK_STATUS_CLAIMED"; got != want {
		t.Errorf(`"status" = %#v, want %q`, got, want)
	}
	spec := m["spec"].(map[string]any)
	if got, want := spec["notBefore"], "2026-11-21T10:00:00Z"; got != want {
		t.Errorf(`"spec.notBefore" = %#v, want %q`, got, want)
	}
	deps, _ := spec["dependsOn"].([]any)
	if len(deps) != 2 || deps[0] != "9223372036854788152" || deps[1] != "2" {
		t.Errorf(`"spec.dependsOn" = %#v, want two strings`, spec["dependsOn"])
	}
	if got, want := spec["payload"], "aGk="; got != want {
		t.Errorf(`"spec.payload" = %#v, want base64 %q`, got, want)
	}
	cur := m["currentClaim"].(map[string]any)
	if got, want := cur["claimId"], "77"; got != want {
		t.Errorf(`"currentClaim.claimId" = %#v, want the string %q`, got, want)
	}
	for _, key := range []string{"createdAt", "updatedAt", "claims", "updates"} {
		if _, ok := m[key]; !ok {
			t.Errorf("key %q missing from %s", key, b)
		}
	}
	for _, snake := range []string{"not_before", "claim_id", "depends_on", "created_at", "current_claim"} {
		if strings.Contains(string(b), `"`+snake+`"`) {
			t.Errorf("snake_case key %q in %s", snake, b)
		}
	}

	var back nornv1.Task
	if err := unmarshal.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&back, sampleTask()) {
		t.Errorf("round trip changed the task:\n got %v\nwant %v", &back, sampleTask())
	}
}

// TestTaskSpecJSONInput is what a client may send: the lowerCamelCase names
// (the proto names are accepted too), uint64 as a string or a number, and
// nothing of the wrong JSON type.
func TestTaskSpecJSONInput(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want *nornv1.TaskSpec // nil: must fail
	}{
		{"minimal", `{"queue":"q"}`, &nornv1.TaskSpec{Queue: "q"}},
		{"camelCase", `{"queue":"q","priority":7,"notBefore":"2026-11-21T10:00:00Z","dependsOn":["9223372036854788153"],"maxClaims":3}`,
			&nornv1.TaskSpec{Queue: "q", Priority: 7, NotBefore: timestamppb.New(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)), DependsOn: []uint64{bigID}, MaxClaims: 3}},
		{"proto names", `{"queue":"q","depends_on":["1"],"max_claims":3}`, &nornv1.TaskSpec{Queue: "q", DependsOn: []uint64{1}, MaxClaims: 3}},
		{"uint64 as number", `{"queue":"q","dependsOn":[42]}`, &nornv1.TaskSpec{Queue: "q", DependsOn: []uint64{42}}},
		{"payload base64", `{"queue":"q","payload":"aGk="}`, &nornv1.TaskSpec{Queue: "q", Payload: []byte("hi")}},
		{"unknown field ignored", `{"queue":"q","colour":"red"}`, &nornv1.TaskSpec{Queue: "q"}},

		{"priority as word", `{"queue":"q","priority":"high"}`, nil},
		{"priority fraction", `{"queue":"q","priority":1.5}`, nil},
		{"priority overflow", `{"queue":"q","priority":2147483648}`, nil},
		{"negative maxClaims", `{"queue":"q","maxClaims":-1}`, nil},
		{"queue not a string", `{"queue":5}`, nil},
		{"dependsOn not a list", `{"queue":"q","dependsOn":"5"}`, nil},
		{"dependsOn not an id", `{"queue":"q","dependsOn":["x"]}`, nil},
		{"notBefore as number", `{"queue":"q","notBefore":1763719200}`, nil},
		{"notBefore not RFC 3339", `{"queue":"q","notBefore":"2026-11-21"}`, nil},
		{"payload not base64", `{"queue":"q","payload":"***"}`, nil},
		{"field twice", `{"queue":"q","queue":"r"}`, nil},
		{"not an object", `["q"]`, nil},
		{"malformed", `{"queue":`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got nornv1.TaskSpec
			err := unmarshal.Unmarshal([]byte(tt.in), &got)
			switch {
			case tt.want == nil && err == nil:
				t.Errorf("%s: unmarshalled to %v, want an error", tt.in, &got)
			case tt.want != nil && err != nil:
				t.Errorf("%s: %v", tt.in, err)
			case tt.want != nil && !proto.Equal(&got, tt.want):
				t.Errorf("%s: got %v, want %v", tt.in, &got, tt.want)
			}
		})
	}
}

func TestDurationAndCountJSON(t *testing.T) {
	b, err := marshal.Marshal(&nornv1.ClaimRequest{Queue: "q", Lease: durationpb.New(1500 * time.Millisecond), Max: 2})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if got, want := m["lease"], "1.500s"; got != want {
		t.Errorf(`"lease" = %#v, want %q`, got, want)
	}

	b, err = marshal.Marshal(&nornv1.CountTasksResponse{Total: 3, ByStatus: map[string]uint64{"READY": 2, "CLAIMED": 1}})
	if err != nil {
		t.Fatal(err)
	}
	m = nil
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	by := m["byStatus"].(map[string]any)
	if m["total"] != "3" || by["READY"] != "2" || by["CLAIMED"] != "1" {
		t.Errorf("count JSON = %s, want total and byStatus values as strings", b)
	}
}

// enqueueEcho answers Enqueue with the requested id (or 1) and one ack.
type enqueueEcho struct {
	nornv1connect.UnimplementedTaskServiceHandler
}

func (enqueueEcho) Enqueue(_ context.Context, req *connect.Request[nornv1.EnqueueRequest]) (*connect.Response[nornv1.EnqueueResponse], error) {
	id := req.Msg.GetId()
	if id == 0 {
		id = 1
	}
	return connect.NewResponse(&nornv1.EnqueueResponse{Id: id, Acks: 1}), nil
}

// TestCurlContract posts JSON the way curl does to a real Connect handler:
// a good request gets 200 and string ids back; a body of the wrong JSON
// type gets HTTP 400 with code "invalid_argument" before any handler runs.
func TestCurlContract(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(nornv1connect.NewTaskServiceHandler(enqueueEcho{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(body string) (int, map[string]any) {
		t.Helper()
		res, err := http.Post(srv.URL+"/norn.v1.TaskService/Enqueue", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("response %q: %v", b, err)
		}
		return res.StatusCode, m
	}

	code, m := post(`{"task":{"queue":"emails","payload":"aGk="},"id":"9223372036854788153","w":1}`)
	if code != http.StatusOK || m["id"] != "9223372036854788153" || m["acks"] != float64(1) {
		t.Errorf("good enqueue: HTTP %d %v, want 200 with id as a string and acks 1", code, m)
	}

	code, m = post(`{"task":{"queue":"emails","priority":"high"}}`)
	if code != http.StatusBadRequest || m["code"] != "invalid_argument" {
		t.Errorf("priority \"high\": HTTP %d %v, want 400 invalid_argument", code, m)
	}
}
