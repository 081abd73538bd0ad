package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// TestCompletion checks that each shell's script names every command and
// every flag of each, that bash's completes, and that the scripts parse
// in the shells installed here.
func TestCompletion(t *testing.T) {
	spec := completionSpec()
	if len(spec.commands) != len(commands)+1 {
		t.Fatalf("the completion lists %d commands, want the %d of the table and help", len(spec.commands), len(commands))
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		script := ok(t, "", "completion", shell)
		for _, c := range spec.commands {
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(c.name) + `\b`).MatchString(script) {
				t.Errorf("%s script does not mention the command %s", shell, c.name)
			}
			for _, f := range c.flags {
				if !strings.Contains(script, "--"+f.name) && !strings.Contains(script, "-l "+f.name) && !strings.Contains(script, "-s "+f.name) {
					t.Errorf("%s script does not mention %s's flag -%s", shell, c.name, f.name)
				}
			}
		}
		for _, f := range spec.globals {
			if !strings.Contains(script, "--"+f.name) && !strings.Contains(script, "-l "+f.name) && !strings.Contains(script, "-s "+f.name) {
				t.Errorf("%s script does not mention the global flag -%s", shell, f.name)
			}
		}
		path := filepath.Join(t.TempDir(), "nornctl."+shell)
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := exec.LookPath(shell); err != nil {
			t.Logf("%s not installed: its script's syntax is not checked", shell)
			continue
		}
		if out, err := exec.Command(shell, "-n", path).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", shell, err, out)
		}
	}
	// Every command has its flags: the table's commands define some.
	for _, c := range spec.commands {
		if c.name == "import" && len(c.flags) == 0 {
			t.Errorf("import's flags were not found")
		}
	}

	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not installed")
	}
	bash := filepath.Join(t.TempDir(), "c.bash")
	if err := os.WriteFile(bash, []byte(ok(t, "", "completion", "bash")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ line, want string }{
		{"nornctl imp", "import"},
		{"nornctl --addr host:1 expo", "export"},
		{"nornctl import --dr", "--dry-run"},
		{"nornctl rebalance can", "cancel"},
		{"nornctl completion fi", "fish"},
		{"nornctl list --st", "--status"},
	} {
		words := strings.Fields(tt.line)
		script := ". " + bash + "; COMP_WORDS=(" + strings.Join(words, " ") + "); COMP_CWORD=" +
			strconv.Itoa(len(words)-1) + "; _nornctl; echo \"${COMPREPLY[*]}\""
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != tt.want {
			t.Errorf("bash completion of %q: %q (%v), want %q", tt.line, out, err, tt.want)
		}
	}
}

// TestVersion checks nornctl version and a node's build in nornctl
// status.
func TestVersion(t *testing.T) {
	goLine := regexp.MustCompile(`^nornctl \S+.* go1\.\d+`)
	if out := ok(t, "", "version"); !goLine.MatchString(out) {
		t.Errorf("nornctl version: %q, want nornctl <version> ... go1.N", out)
	}
	var info nornv1.BuildInfo
	okJSON(t, "", &info, "version")
	if info.GetVersion() == "" || info.GetGoVersion() != runtime.Version() {
		t.Errorf("nornctl version -o json: %v, want a version and Go %s", &info, runtime.Version())
	}
	addr := startNornd(t)
	var st nornv1.StatusResponse
	okJSON(t, addr, &st, "status")
	if st.GetBuild().GetGoVersion() != runtime.Version() || st.GetBuild().GetVersion() != st.GetVersion() {
		t.Errorf("status: version %q, build %v; want the build with Go %s and the same version", st.GetVersion(), st.GetBuild(), runtime.Version())
	}
	mustContain(t, "status", ok(t, addr, "status"), "VERSION:", runtime.Version())
}
