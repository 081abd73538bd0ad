package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

func testEndpoints(seeds ...string) *endpoints {
	return newEndpoints(seeds, func(base string) *endpoint { return &endpoint{base: base} })
}

// picks returns the bases of n picks at now, each avoiding none.
func picks(e *endpoints, now time.Time, n int) []string {
	var out []string
	for range n {
		out = append(out, e.pick(now, nil).base)
	}
	return out
}

// TestEndpointsHealth walks the health state machine with a fake clock:
// round robin, skipping a failed endpoint for its backoff, one doubling
// per failure episode, reset on success, and a pick even when every
// endpoint is down.
func TestEndpointsHealth(t *testing.T) {
	e := testEndpoints("a", "b", "c")
	byBase := map[string]*endpoint{}
	for _, ep := range e.list {
		byBase[ep.base] = ep
	}
	a, b, c := byBase["a"], byBase["b"], byBase["c"]
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: picks %v, want %v", what, got, want)
		}
	}

	check("round robin", picks(e, t0, 4), []string{"a", "b", "c", "a"})

	if !e.failed(b, t0) {
		t.Fatal("first failure of b: not reported as going down")
	}
	if e.failed(b, at(10*time.Millisecond)) {
		t.Fatal("second failure of b while down: reported as going down")
	}
	check("b down", picks(e, at(999*time.Millisecond), 4), []string{"c", "a", "c", "a"})
	check("b back after 1 s", picks(e, at(time.Second), 3), []string{"b", "c", "a"})

	if !e.failed(b, at(time.Second)) {
		t.Fatal("failure after the backoff: not reported as going down")
	}
	if got := b.downUntil.Sub(at(time.Second)); got != 2*time.Second {
		t.Fatalf("second episode backoff = %v, want 2s", got)
	}
	e.succeeded(b)
	check("b reset by success", picks(e, at(time.Second), 3), []string{"b", "c", "a"})
	if b.failures != 0 {
		t.Fatalf("failures after success = %d", b.failures)
	}

	// avoid: the avoided one is used when it is the only healthy one
	// (TestEndpointsAvoid covers the rest).
	e.failed(b, at(2*time.Second))
	e.failed(c, at(2*time.Second))
	if got := e.pick(at(2*time.Second), a); got != a {
		t.Fatalf("pick avoiding the only healthy a = %s", got.base)
	}

	// All down: the one that failed least recently, and trying it
	// moves on to the next.
	e.failed(a, at(2500*time.Millisecond))
	if e.failed(b, at(2600*time.Millisecond)) { // b is still down: failedAt moves, the backoff does not
		t.Fatal("failure of b while down: reported as going down")
	}
	if got := b.downUntil; !got.Equal(at(3 * time.Second)) {
		t.Fatalf("b down until %v, want %v", got, at(3*time.Second))
	}
	now := at(2900 * time.Millisecond)
	if got := e.pick(now, nil); got != c {
		t.Fatalf("all down: picked %s, want c (failed longest ago)", got.base)
	}
	if e.failed(c, now) {
		t.Fatal("failure of c while down: reported as going down")
	}
	if got := e.pick(now, nil); got != a {
		t.Fatalf("all down after c failed again: picked %s, want a", got.base)
	}
}

// TestEndpointsAvoid: a retry goes to another endpoint than its previous
// attempt even when round robin would give it the same one, and the next
// call carries on after the one it got.
func TestEndpointsAvoid(t *testing.T) {
	e := testEndpoints("a", "b", "c")
	a := e.list[0]
	if got := e.pick(time.Unix(1, 0), a); got.base != "b" {
		t.Fatalf("pick avoiding a, with a next in turn = %s, want b", got.base)
	}
	if got := picks(e, time.Unix(1, 0), 2); !slices.Equal(got, []string{"c", "a"}) {
		t.Fatalf("picks after = %v, want [c a]", got)
	}
}

func TestEndpointBackoff(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {5, 16 * time.Second},
		{6, 30 * time.Second}, {1000, 30 * time.Second},
	} {
		if got := endpointBackoff(tc.n); got != tc.want {
			t.Errorf("endpointBackoff(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// TestEndpointsSet: the seeds stay first and are never dropped, learned
// endpoints follow in order without duplicates, and endpoints already
// known keep their state.
func TestEndpointsSet(t *testing.T) {
	e := testEndpoints("s1", "s2")
	s1 := e.list[0]
	e.set([]string{"z", "m", "s2", "m"})
	if got := e.bases(); !slices.Equal(got, []string{"s1", "s2", "m", "z"}) {
		t.Fatalf("bases = %v", got)
	}
	m := e.list[2]
	e.failed(m, time.Unix(1, 0))
	e.set([]string{"m"})
	if got := e.bases(); !slices.Equal(got, []string{"s1", "s2", "m"}) {
		t.Fatalf("bases = %v", got)
	}
	if e.list[0] != s1 || e.list[2] != m || m.failures != 1 {
		t.Fatal("set replaced endpoints it already had")
	}
	e.set(nil)
	if got := e.bases(); !slices.Equal(got, []string{"s1", "s2"}) {
		t.Fatalf("bases after an empty set = %v", got)
	}
	if e.pick(time.Unix(1, 0), nil) == nil {
		t.Fatal("no pick")
	}
}

func TestEndpointDown(t *testing.T) {
	wireWF := connect.NewWireError(connect.CodeUnavailable, errors.New("write quorum not reached"))
	d, err := connect.NewErrorDetail(&nornv1.WriteFailure{Ids: []uint64{7}, Acks: 1, W: 2})
	if err != nil {
		t.Fatal(err)
	}
	wireWF.AddDetail(d)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("connect: %w", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		name string
		err  error
		down bool
	}{
		{"nil", nil, false},
		{"answered not found", connect.NewWireError(connect.CodeNotFound, errors.New("x")), false},
		{"answered failed precondition", connect.NewWireError(connect.CodeFailedPrecondition, errors.New("x")), false},
		{"answered unavailable", connect.NewWireError(connect.CodeUnavailable, errors.New("no leader")), true},
		{"answered quorum failure", wireWF, false},
		{"refused", connect.NewError(connect.CodeUnavailable, refused), true},
		{"refused, bare", refused, true},
		{"reset (connect says canceled)", connect.NewError(connect.CodeCanceled, fmt.Errorf("read: %w", syscall.ECONNRESET)), true},
		{"no such host", connect.NewError(connect.CodeUnavailable, &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}), true},
		{"http2 gave up", connect.NewError(connect.CodeUnavailable, errors.New("http2: client connection lost")), true},
		{"own deadline", connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), false},
		{"own cancel", connect.NewError(connect.CodeCanceled, context.Canceled), false},
		{"protocol error", connect.NewError(connect.CodeInternal, errProtocol("x")), false},
	} {
		if got := endpointDown(tc.err); got != tc.down {
			t.Errorf("%s: endpointDown = %v, want %v", tc.name, got, tc.down)
		}
	}
}

func TestParseSeeds(t *testing.T) {
	for _, tc := range []struct {
		in     string
		want   []string
		scheme string
	}{
		{"127.0.0.1:7400", []string{"http://127.0.0.1:7400"}, "http"},
		{"a:1,b:2", []string{"http://a:1", "http://b:2"}, "http"},
		{" a:1 , http://b:2 ", []string{"http://a:1", "http://b:2"}, "http"},
		{"a:1,a:1,http://a:1/", []string{"http://a:1"}, "http"},
		{"https://a:1,https://b:2", []string{"https://a:1", "https://b:2"}, "https"},
		{"", nil, ""},
		{",", nil, ""},
		{"a:1,", nil, ""},
		{"a:1,,b:2", nil, ""},
		{"a:1,https://b:2", nil, ""},
		{"a:1,ftp://b:2", nil, ""},
		{"a:1,http://[::1", nil, ""},
	} {
		got, scheme, err := parseSeeds(tc.in)
		if (err == nil) != (tc.want != nil) {
			t.Errorf("parseSeeds(%q) error = %v", tc.in, err)
			continue
		}
		if !slices.Equal(got, tc.want) || scheme != tc.scheme {
			t.Errorf("parseSeeds(%q) = %v, %q; want %v, %q", tc.in, got, scheme, tc.want, tc.scheme)
		}
	}
}

func TestNodeBase(t *testing.T) {
	for _, tc := range []struct {
		addr, scheme, want string
	}{
		{"10.0.0.2:7400", "http", "http://10.0.0.2:7400"},
		{"node-2.norn:7400", "https", "https://node-2.norn:7400"},
		{"[fd00::2]:7400", "http", "http://[fd00::2]:7400"},
		{"http://10.0.0.2:7400", "http", "http://10.0.0.2:7400"},
		{"http://10.0.0.2:7400", "https", ""}, // not the seeds' scheme
		{"", "http", ""},
		{":7400", "http", ""},
		{"0.0.0.0:7400", "http", ""},
		{"[::]:7400", "http", ""},
		{"10.0.0.2:7400?x=1", "http", ""},
	} {
		got, ok := nodeBase(tc.addr, tc.scheme)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("nodeBase(%q, %q) = %q, %v; want %q", tc.addr, tc.scheme, got, ok, tc.want)
		}
	}
}
