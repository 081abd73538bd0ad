package node

// The OpenAPI document (package openapi, generated from the .proto files)
// against the API it describes: every TaskService path it documents is
// called on a real node over HTTP/JSON, as curl would, with a request
// built from the document's own request schema, and the answer is
// validated against the document's response schema (kin-openapi's
// openapi3filter). A property the API does not have is refused with
// INVALID_ARGUMENT naming it (transport.StrictJSON), a path it does not
// serve is a 404, and a response field or type the document does not
// describe fails the validation: any of them means the document and the
// API disagree.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
	"github.com/norn-dev/norn/api/openapi"
)

// loadOpenAPI parses and validates the document nornd serves.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openapi.YAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return doc
}

// missingTask is a task id no test here creates: ids below 2^40 are never
// issued by the node (docs/API.md, "Export and import").
const missingTask = "12345"

// TestOpenAPITaskService calls every TaskService path of the document:
// once with the values of its table (below), wanting 200 and a body of
// the documented response schema; and, for a method that acts on a task
// by `id` (byID), once more with a task that does not exist, wanting
// NOT_FOUND, its body of the documented error schema.
func TestOpenAPITaskService(t *testing.T) {
	doc := loadOpenAPI(t)
	h := newHarness(t, t.TempDir(), nil)
	tables := openAPIFixtures(t, h)
	client := h.srv.Client() // HTTP/1.1, as curl

	prefix := "/" + nornv1connect.TaskServiceName + "/"
	var paths []string
	for _, p := range doc.Paths.InMatchingOrder() {
		if strings.HasPrefix(p, prefix) {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	methods := nornv1.File_norn_v1_task_service_proto.Services().ByName("TaskService").Methods()
	if len(paths) != methods.Len() || len(paths) != len(tables) {
		t.Fatalf("the document has %d TaskService paths, the service %d methods, the test tables %d", len(paths), methods.Len(), len(tables))
	}
	for _, path := range paths {
		method := strings.TrimPrefix(path, prefix)
		t.Run(method, func(t *testing.T) {
			table, ok := tables[method]
			if !ok {
				t.Fatalf("no table of values for %s: add one to openAPIFixtures", method)
			}
			route := &routers.Route{Spec: doc, Path: path, PathItem: doc.Paths.Value(path), Method: http.MethodPost}
			route.Operation = route.PathItem.Post
			schema := route.Operation.RequestBody.Value.Content.Get("application/json").Schema.Value
			body := requestFromSchema(schema, "", table)
			if status, msg := callDocumented(t, client, h.srv.URL, route, body); status != http.StatusOK {
				t.Fatalf("%s: %d %s, want 200", path, status, msg)
			}
			if !slices.Contains(byID, method) {
				return
			}
			table = maps.Clone(table)
			table["id"] = missingTask
			body = requestFromSchema(schema, "", table)
			status, msg := callDocumented(t, client, h.srv.URL, route, body)
			var cerr struct{ Code string }
			json.Unmarshal(msg, &cerr) //nolint:errcheck // compared below
			if status == http.StatusOK || cerr.Code != connect.CodeNotFound.String() {
				t.Fatalf("%s of a task that does not exist: %d %s, want not_found", path, status, msg)
			}
		})
	}
}

// byID are the methods that act on the task their `id` names: for a
// task that does not exist each answers NOT_FOUND (docs/API.md, Errors),
// the calls under a claim too, before they look at the claim. (Enqueue's
// `id` is the caller's id of a new task.)
var byID = []string{"GetTask", "Cancel", "Retry", "Renew", "Update", "Complete", "Abort", "Yield"}

// callDocumented validates body as the request of route, POSTs it as
// JSON (with the header the document requires) and validates the answer,
// 200 or a Connect error, against the document. It returns the status
// and the body. A 404 (no such path) or an INVALID_ARGUMENT naming an
// unknown field fails the test: the document describes what the API
// does not have.
func callDocumented(t *testing.T, client *http.Client, base string, route *routers.Route, body any) (int, []byte) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	newRequest := func() *http.Request {
		req, err := http.NewRequest(http.MethodPost, base+route.Path, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Connect-Protocol-Version", "1")
		return req
	}
	ctx := context.Background()
	// The node checks no caller: any of the document's security
	// alternatives (none, a token, a certificate) is as good.
	in := &openapi3filter.RequestValidationInput{Request: newRequest(), Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
		t.Fatalf("the request built from the schema does not validate against it: %v\n%s", err, data)
	}
	resp, err := client.Do(newRequest())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusNotFound && !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("%s: 404, no such path: %s", route.Path, got)
	}
	if resp.StatusCode == http.StatusBadRequest && bytes.Contains(got, []byte("unknown field")) {
		t.Fatalf("%s refuses a field of the document: %s\nrequest: %s", route.Path, got, data)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(ctx, out.SetBodyBytes(got)); err != nil {
		t.Fatalf("%s: the answer does not validate against the document: %v\nrequest: %s\nanswer: %d %s", route.Path, err, data, resp.StatusCode, got)
	}
	return resp.StatusCode, got
}

// requestFromSchema builds a JSON value of schema s, the property name
// (at any depth) of which is name. Every property of an object is
// filled, so that every documented field reaches the API. A value comes
// from table when it has name; otherwise from the schema: its first
// example (a duration "30s"), its first enum value (the _UNSPECIFIED
// zero), or the zero of its type (64-bit integers as proto3 JSON's
// strings), base64 text for bytes; an array gets one element, a map none.
func requestFromSchema(s *openapi3.Schema, name string, table map[string]any) any {
	switch {
	case s.Type.Includes(openapi3.TypeArray):
		return []any{requestFromSchema(s.Items.Value, name, table)}
	case table[name] != nil:
		return table[name]
	case s.Type.Includes(openapi3.TypeObject):
		out := map[string]any{}
		for p, ps := range s.Properties {
			out[p] = requestFromSchema(ps.Value, p, table)
		}
		return out
	case len(s.Examples) > 0:
		return s.Examples[0]
	case len(s.Enum) > 0:
		return s.Enum[0]
	case s.Type.Includes(openapi3.TypeInteger) && s.Type.Includes(openapi3.TypeString):
		return "0"
	case s.Type.Includes(openapi3.TypeInteger), s.Type.Includes(openapi3.TypeNumber):
		return 0
	case s.Type.Includes(openapi3.TypeBoolean):
		return false
	case s.Format == "byte":
		return base64.StdEncoding.EncodeToString([]byte("openapi"))
	default:
		return ""
	}
}

// openAPIFixtures makes the tasks the calls act on and returns each
// method's table of values. The table is the one place that knows the
// API's rules beyond the document's types, and names only what the zero
// values and the document's examples do not satisfy:
//
//   - common to all: a queue name (`queue`, 1-128 of [A-Za-z0-9._:-]),
//     the worker, a non-empty error `code`, the BulkAction `action`, the
//     times whose order the API checks (a deadline after notBefore and
//     in the node's future; createdAfter before createdBefore), a
//     `uniqueKey` (the document's uniqueFor example needs one), an
//     Update's `seq` (from 1) and a task that exists for `dependsOn`
//     (one completed here);
//   - per method: the task `id` (and `claimId`) it acts on, made here:
//     claimed for the calls under a claim, ready for Cancel, cancelled
//     for Retry; and the queues of Claim and BulkAction, each of their
//     own so that they take only the task made for them.
func openAPIFixtures(t *testing.T, h *harness) map[string]map[string]any {
	t.Helper()
	ctx := context.Background()
	id := func(id uint64) string { return strconv.FormatUint(id, 10) }
	enqueue := func(queue string) uint64 { return h.enqueue(&nornv1.TaskSpec{Queue: queue}) }
	cancel := func(task uint64) {
		if _, err := h.api.Cancel(ctx, connect.NewRequest(&nornv1.CancelRequest{Id: task})); err != nil {
			t.Fatal(err)
		}
	}
	underClaim := []string{"done", "Renew", "Update", "Complete", "CompleteBatch", "Abort", "Yield"}
	for range underClaim {
		enqueue("openapi")
	}
	var claimed []*nornv1.ClaimedTask
	for len(claimed) < len(underClaim) {
		got := h.claim("openapi", uint32(len(underClaim)-len(claimed)), time.Hour)
		if len(got) == 0 {
			t.Fatalf("claimed %d tasks, want %d", len(claimed), len(underClaim))
		}
		claimed = append(claimed, got...)
	}
	byUse := map[string]*nornv1.ClaimedTask{}
	for i, use := range underClaim {
		byUse[use] = claimed[i]
	}
	done := byUse["done"]
	if _, err := h.api.Complete(ctx, connect.NewRequest(&nornv1.CompleteRequest{Id: done.Task.Id, ClaimId: done.ClaimId})); err != nil {
		t.Fatal(err)
	}
	ready := enqueue("openapi")
	cancelled := enqueue("openapi")
	cancel(cancelled)
	enqueue("openapi-claim")
	cancel(enqueue("openapi-bulk"))

	now := h.clock.Now()
	common := map[string]any{
		"queue": "openapi", "worker": "w1", "code": "openapi", "action": "ACTION_RETRY",
		"notBefore": now.Format(time.RFC3339), "deadline": now.Add(time.Hour).Format(time.RFC3339),
		"createdAfter": now.Add(-time.Hour).Format(time.RFC3339), "createdBefore": now.Add(time.Hour).Format(time.RFC3339),
		"uniqueKey": "openapi", "seq": "1", "dependsOn": id(done.Task.Id),
	}
	tables := map[string]map[string]any{
		"Enqueue": {}, "EnqueueBatch": {}, "ListTasks": {}, "CountTasks": {},
		"GetTask":    {"id": id(done.Task.Id)},
		"Cancel":     {"id": id(ready)},
		"Retry":      {"id": id(cancelled)},
		"Claim":      {"queue": "openapi-claim"},
		"BulkAction": {"queue": "openapi-bulk"},
	}
	for _, use := range underClaim[1:] {
		tables[use] = map[string]any{"id": id(byUse[use].Task.Id), "claimId": id(byUse[use].ClaimId)}
	}
	for method, table := range tables {
		tables[method] = maps.Clone(common)
		maps.Copy(tables[method], table)
	}
	return tables
}

// TestOpenAPIServedOpen: GET /openapi.yaml and /openapi.json answer the
// document without credentials on a node that checks its callers, where
// a TaskService call without them is refused.
func TestOpenAPIServedOpen(t *testing.T) {
	h, _, _ := aliceAndRoot(t)
	for p, want := range map[string][]byte{openapi.PathYAML: openapi.YAML, openapi.PathJSON: openapi.JSON} {
		resp, err := h.srv.Client().Get(h.srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
			t.Errorf("GET %s without credentials: %d, %d bytes (%v); want 200 and the document", p, resp.StatusCode, len(got), err)
		}
	}
	_, err := h.api.GetTask(context.Background(), connect.NewRequest(&nornv1.GetTaskRequest{Id: 1}))
	wantCode(t, err, connect.CodeUnauthenticated)
}
