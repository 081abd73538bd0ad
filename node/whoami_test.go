package node

import (
	"context"
	"slices"
	"testing"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestWhoAmI: with an access file, any caller it knows may ask who it is
// (alice has no admin grant, nor a grant on every queue) and gets its
// user, how it was found and its grants; an unknown token is refused;
// without access control the answer says so.
func TestWhoAmI(t *testing.T) {
	h, tok, admTok := aliceAndRoot(t)
	ctx := context.Background()
	ask := func(token string) (*nornv1.WhoAmIResponse, error) {
		req := connect.NewRequest(&nornv1.WhoAmIRequest{})
		if token != "" {
			req.Header().Set("Authorization", "Bearer "+token)
		}
		r, err := h.admin.WhoAmI(ctx, req)
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	alice, err := ask(tok)
	if err != nil {
		t.Fatalf("alice's WhoAmI: %v", err)
	}
	var roles []string
	for _, g := range alice.Grants {
		if !slices.Equal(g.Queues, []string{"mine"}) {
			t.Errorf("alice's grant %v, want on queue mine", g)
		}
		roles = append(roles, g.Role)
	}
	if alice.User != "alice" || alice.Via != "token" || !alice.AccessControl || !slices.Equal(roles, []string{"producer", "worker", "reader"}) {
		t.Fatalf("alice: %v", alice)
	}
	root, err := ask(admTok)
	if err != nil || root.User != "root" || len(root.Grants) != 1 || root.Grants[0].Role != "admin" || len(root.Grants[0].Queues) != 0 {
		t.Fatalf("root: %v, %v", root, err)
	}
	if _, err := ask("norn_nope_nope"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("an unknown token: %v, want UNAUTHENTICATED", err)
	}
	if _, err := ask(""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("no credentials: %v, want UNAUTHENTICATED", err)
	}

	open := newHarness(t, t.TempDir(), nil)
	r, err := open.admin.WhoAmI(ctx, connect.NewRequest(&nornv1.WhoAmIRequest{}))
	if err != nil || r.Msg.AccessControl || r.Msg.User != "" || len(r.Msg.Grants) != 0 {
		t.Fatalf("without access control: %v, %v", r, err)
	}
}
