package openapi_test

// The committed document against an OpenAPI 3.1 validator of the ecosystem
// (kin-openapi, an implementation independent of the generator's
// libopenapi), and against the API it describes: every method of the
// public services has its path, PeerService none.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"google.golang.org/protobuf/reflect/protoreflect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/openapi"
)

// load parses and validates one form of the document: structure,
// references, JSON Schema 2020-12 keywords and every example against its
// schema.
func load(t *testing.T, name string, data []byte) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("%s: openapi %q, want 3.1", name, doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("%s does not validate: %v", name, err)
	}
	return doc
}

func TestOpenAPIDocumentValidates(t *testing.T) {
	doc := load(t, "norn.openapi.yaml", openapi.YAML)
	fromJSON := load(t, "norn.openapi.json", openapi.JSON)
	a, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(fromJSON)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Error("norn.openapi.yaml and norn.openapi.json differ: run make proto")
	}
	if doc.Info.Title != "Norn" || doc.Info.Version != "v1" {
		t.Errorf("info: title %q version %q, want Norn v1", doc.Info.Title, doc.Info.Version)
	}
	// JSON Schema's `examples` are annotations, which Validate leaves
	// alone: each must still be a value of its schema (override.yaml's
	// duration and timestamp examples, the generator's own).
	for name, s := range doc.Components.Schemas {
		for _, ex := range s.Value.Examples {
			if err := s.Value.VisitJSON(ex, openapi3.EnableJSONSchema2020()); err != nil {
				t.Errorf("schema %s: example %v: %v", name, ex, err)
			}
		}
	}
}

// TestOpenAPIPathsAreTheAPI checks the document's paths are exactly the
// methods of TaskService, QueueService and AdminService, each a POST of
// JSON with a request body, a 200 answer and a Connect error otherwise.
func TestOpenAPIPathsAreTheAPI(t *testing.T) {
	doc := load(t, "norn.openapi.yaml", openapi.YAML)
	var want []string
	for _, file := range []protoreflect.FileDescriptor{nornv1.File_norn_v1_task_service_proto,
		nornv1.File_norn_v1_queue_service_proto, nornv1.File_norn_v1_admin_service_proto} {
		for i := range file.Services().Len() {
			sd := file.Services().Get(i)
			for j := range sd.Methods().Len() {
				want = append(want, "/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name()))
			}
		}
	}
	got := doc.Paths.InMatchingOrder()
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("paths:\n got %v\nwant %v", got, want)
	}
	for _, path := range got {
		item := doc.Paths.Find(path)
		op := item.Post
		if op == nil || len(item.Operations()) != 1 {
			t.Errorf("%s: want one operation, a POST; have %v", path, item.Operations())
			continue
		}
		if op.RequestBody == nil || op.RequestBody.Value.Content.Get("application/json") == nil {
			t.Errorf("%s: no JSON request body", path)
		}
		for _, status := range []int{http.StatusOK, 0} {
			r := op.Responses.Status(status)
			if status == 0 {
				r = op.Responses.Default()
			}
			if r == nil || r.Value.Content.Get("application/json") == nil {
				t.Errorf("%s: no JSON response for status %d (0: the default, Connect's error)", path, status)
			}
		}
	}
}

func TestOpenAPIServed(t *testing.T) {
	mux := http.NewServeMux()
	openapi.Mount(mux)
	for path, want := range map[string]struct {
		ctype string
		body  []byte
	}{openapi.PathYAML: {"application/yaml", openapi.YAML}, openapi.PathJSON: {"application/json", openapi.JSON}} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != want.ctype || rec.Body.String() != string(want.body) {
			t.Errorf("GET %s: %d %q, %d bytes; want 200 %q, the document", path, rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len(), want.ctype)
		}
	}
}
