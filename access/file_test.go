package access

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestGrantCovers(t *testing.T) {
	for _, tc := range []struct {
		queues []string
		queue  string
		want   bool
	}{
		{nil, "anything", true},
		{[]string{"*"}, "anything", true},
		{[]string{"emails"}, "emails", true},
		{[]string{"emails"}, "emails2", false},
		{[]string{"billing.*"}, "billing.eu", true},
		{[]string{"billing.*"}, "billing", false},
		{[]string{"billing.*"}, "billingx", false},
		{[]string{"a", "b*"}, "bee", true},
	} {
		if got := (Grant{Role: RoleWorker, Queues: tc.queues}).Covers(tc.queue); got != tc.want {
			t.Errorf("%v covers %q: %v, want %v", tc.queues, tc.queue, got, tc.want)
		}
	}
}

// TestFileRoundTrip: a file written reads back; a token made for it is
// found, another one, a changed one and a revoked one are not.
func TestFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	tok, entry := NewToken("ci", time.Now())
	f := &File{Users: map[string]User{"ci": {Grants: []Grant{{Role: RoleProducer, Queues: []string{"emails"}}}}}, Tokens: []TokenEntry{entry}}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), tok) {
		t.Fatal("the file holds the token itself")
	}
	r, err := LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := r.TokenUser(tok); !ok || u != "ci" {
		t.Fatalf("the token: %q %v", u, ok)
	}
	other, _ := NewToken("ci", time.Now())
	for _, bad := range []string{other, tok[:len(tok)-1] + "x", "", "norn_", "Bearer " + tok} {
		if _, ok := r.TokenUser(bad); ok {
			t.Errorf("token %q accepted", bad)
		}
	}
	if g := r.Grants("ci"); len(g) != 1 || g[0].Role != RoleProducer {
		t.Fatalf("grants: %+v", g)
	}
	f.Tokens = nil
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.TokenUser(tok); ok {
		t.Fatal("a revoked token still accepted")
	}
}

// TestReadFileRefuses: unknown fields, unknown roles, bad patterns and
// malformed tokens are errors that say where; a failed reload keeps the
// rules in use.
func TestReadFileRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"unknown field":  `{"users": {}, "tokenz": []}`,
		"unknown role":   `{"users": {"a": {"grants": [{"role": "root"}]}}}`,
		"bad pattern":    `{"users": {"a": {"grants": [{"role": "worker", "queues": ["a*b"]}]}}}`,
		"empty pattern":  `{"users": {"a": {"grants": [{"role": "worker", "queues": [""]}]}}}`,
		"token no hash":  `{"users": {}, "tokens": [{"id": "x", "user": "a"}]}`,
		"token repeated": `{"users": {}, "tokens": [{"id": "x", "user": "a", "sha256": "` + strings.Repeat("0", 64) + `"}, {"id": "x", "user": "b", "sha256": "` + strings.Repeat("1", 64) + `"}]}`,
		"not json":       `users: {}`,
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		os.WriteFile(p, []byte(body), 0o600)
		if _, err := ReadFile(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"users": {"a": {"grants": [{"role": "admin"}]}}}`), 0o600)
	r, err := LoadRules(good)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(good, []byte(`{"users": {"a": {"grants": [{"role": "root"}]}}}`), 0o600)
	if err := r.Reload(); err == nil {
		t.Fatal("a bad reload succeeded")
	}
	if g := r.Grants("a"); len(g) != 1 || g[0].Role != RoleAdmin {
		t.Fatalf("after a failed reload: %+v", g)
	}
}
