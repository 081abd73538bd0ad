package main

import (
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseHasNoTestHooks builds nornd as a release (no build tags) and
// checks that it carries no test hook: the flags are unknown, the routes
// answer 404, and the binary holds none of the hooks' code (the test
// clock, the crash route, faultfs, the seeded bugs' parser).
func TestReleaseHasNoTestHooks(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nornd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, flag := range []string{"-test-hooks", "-test-bug"} {
		if strings.Contains(string(help), flag) {
			t.Errorf("the release nornd knows %s:\n%s", flag, help)
		}
		out, err := exec.Command(bin, "-data-dir", t.TempDir(), "-listen", "127.0.0.1:0", flag).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "flag provided but not defined") {
			t.Errorf("nornd %s: %v, want an unknown flag\n%s", flag, err, out)
		}
	}
	syms, err := exec.Command("go", "tool", "nm", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool nm: %v\n%s", err, syms)
	}
	for _, sym := range []string{"main.testHandler", "main.(*testClock)", "norn/faultfs.", "norn/node.ParseTestBugs", "main.newTestClock"} {
		if strings.Contains(string(syms), sym) {
			t.Errorf("the release nornd holds %s", sym)
		}
	}
	// Served, the routes are not there either.
	addr := freeAddr(t)
	saved := norndBin
	norndBin = bin
	startNornd(t, t.TempDir(), addr)
	norndBin = saved
	for _, r := range [][2]string{{"GET", "/test/clock"}, {"POST", "/test/clock"}, {"POST", "/test/crash"}} {
		req, _ := http.NewRequest(r[0], "http://"+addr+r[1], strings.NewReader(`{"offset_ms": 1000}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s on the release nornd: %d", r[0], r[1], resp.StatusCode)
		}
	}
}

// TestMetricsAddr: with -metrics-addr, /metrics is served there and no
// longer on the API port.
func TestMetricsAddr(t *testing.T) {
	addr, maddr := freeAddr(t), freeAddr(t)
	startNornd(t, t.TempDir(), addr, "-metrics-addr", maddr)
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("http://" + maddr + "/metrics"); code != http.StatusOK || !strings.Contains(body, "norn_") {
		t.Fatalf("metrics address: %d %.200s", code, body)
	}
	if code, _ := get("http://" + addr + "/metrics"); code != http.StatusNotFound {
		t.Fatalf("API port /metrics with -metrics-addr: %d, want 404", code)
	}
}
