package node

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/api/norn/v1/nornv1connect"
)

// TestConsoleClientCertificate: on a node served with TLS as nornd serves
// it, a browser presenting a client certificate of the cluster's CA is
// its holder at once (no login: the node's own check of the certificate,
// whose verified chain the handshake leaves empty), and acts with its
// page's CSRF token; one without a certificate goes to the login page;
// a certificate holder's session cookie is not needed nor set.
func TestConsoleClientCertificate(t *testing.T) {
	dir := makeTestCerts(t, 1)
	m := tlsCluster(t, 1, dir, nil)[0]
	base := "https://" + m.cfg.APIAddr
	get := func(user, path string) (*http.Response, string) {
		t.Helper()
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(t, dir, user)},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		t.Cleanup(hc.CloseIdleConnections)
		resp, err := hc.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	api := nornv1connect.NewTaskServiceClient(&http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(t, dir, "alice")}}, base)
	if _, err := api.Enqueue(context.Background(), connect.NewRequest(&nornv1.EnqueueRequest{Task: &nornv1.TaskSpec{Queue: "emails"}})); err != nil {
		t.Fatal(err)
	}
	resp, body := get("alice", "/ui/queues")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "alice") || resp.Header.Get("Set-Cookie") != "" {
		t.Fatalf("alice's certificate: %d, cookie %q\n%s", resp.StatusCode, resp.Header.Get("Set-Cookie"), body)
	}
	if resp, _ := get("", "/ui/queues"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("no certificate: %d to %q, want the login page", resp.StatusCode, resp.Header.Get("Location"))
	}
	// An action with the page's CSRF token: TLS without an access file
	// lets every certificate of the CA do everything.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(t, dir, "alice")},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer hc.CloseIdleConnections()
	form := url.Values{"csrf": {csrfField.FindStringSubmatch(body)[1]}, "paused": {"true"}}
	req, _ := http.NewRequest("POST", base+"/ui/queues/emails/pause", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	presp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	presp.Body.Close()
	if loc := presp.Header.Get("Location"); presp.StatusCode != http.StatusSeeOther || strings.Contains(loc, "error") {
		t.Fatalf("alice's pause: %d to %q", presp.StatusCode, loc)
	}
	if _, body := get("alice", "/ui/queues"); !strings.Contains(body, "emails") || !strings.Contains(body, "Resume") {
		t.Fatalf("after alice's pause: no paused emails queue\n%s", body)
	}
}
