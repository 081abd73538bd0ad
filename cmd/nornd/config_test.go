package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/node"
	"github.com/norn-dev/norn/testhooks"
)

// configRow is one row of docs/CONFIGURATION.md's table.
type configRow struct {
	env, def, meaning string
}

// configTable reads docs/CONFIGURATION.md's table of settings by flag name.
func configTable(t *testing.T) map[string]configRow {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "CONFIGURATION.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `-([a-z0-9-]+)` \\| (`NORN_[A-Z0-9_]+`|none) \\| (`[^`]*`|none) \\| (.+) \\|$")
	rows := map[string]configRow{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `-") {
			continue
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("CONFIGURATION.md: a row not of the form | `-flag` | `NORN_...` or none | `default` or none | meaning |: %s", line)
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("CONFIGURATION.md: -%s has two rows", m[1])
		}
		rows[m[1]] = configRow{env: strings.Trim(m[2], "`"), def: strings.Trim(m[3], "`"), meaning: m[4]}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestConfigurationTable checks docs/CONFIGURATION.md against nornd's
// flags: a row per flag and a flag per row, each flag's environment
// variable and default as nornd has them.
func TestConfigurationTable(t *testing.T) {
	rows := configTable(t)
	fs := flag.NewFlagSet("nornd", flag.ContinueOnError)
	defineFlags(fs, &node.Config{})
	fs.VisitAll(func(f *flag.Flag) {
		r, ok := rows[f.Name]
		if !ok {
			t.Errorf("-%s is not documented in docs/CONFIGURATION.md", f.Name)
			return
		}
		delete(rows, f.Name)
		wantEnv := envName(f.Name)
		if noEnv[f.Name] {
			wantEnv = "none"
		}
		if r.env != wantEnv {
			t.Errorf("-%s: the table's environment variable is %s, want %s", f.Name, r.env, wantEnv)
		}
		wantDef := f.DefValue
		if wantDef == "" {
			wantDef = "none"
		}
		if r.def != wantDef {
			t.Errorf("-%s: the table's default is %q, nornd's %q", f.Name, r.def, wantDef)
		}
	})
	for name, r := range rows {
		// The test hooks' flags exist only in a build with the tag.
		if !testhooks.Built && strings.Contains(r.meaning, "testhooks builds only") {
			continue
		}
		t.Errorf("docs/CONFIGURATION.md documents -%s, which nornd does not have", name)
	}
	{
		r := configTable(t)["log-level"]
		for _, c := range node.LogComponents {
			if !strings.Contains(r.meaning, c) {
				t.Errorf("-log-level's row does not name the component %s", c)
			}
		}
	}
}

// TestSettingPrecedence checks command line > environment > config file >
// default, and the refusals of bad values.
func TestSettingPrecedence(t *testing.T) {
	config := filepath.Join(t.TempDir(), "nornd.json")
	b, _ := json.Marshal(map[string]any{"listen": "127.0.0.1:3", "skew-buffer": "3s", "retention": "1h", "auto-rebalance": true})
	if err := os.WriteFile(config, b, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"NORN_LISTEN=127.0.0.1:2", "NORN_SKEW_BUFFER=4s", "NORN_REPLICATION=5", "NORN_CONFIG=" + config,
		"NORN_ADDR=127.0.0.1:9", "NORN_PORT=tcp://10.0.0.1:7400", "NORN_VERSION=true", "OTHER_LISTEN=x"}
	var cfg node.Config
	fs := flag.NewFlagSet("nornd", flag.ContinueOnError)
	o := defineFlags(fs, &cfg)
	if err := fs.Parse([]string{"-listen", "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(fs, env); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigFile(fs, *o.config); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name, got, want string
	}{
		{"listen (command line over env and file)", *o.listen, "127.0.0.1:1"},
		{"skew-buffer (env over file)", cfg.SkewBuffer.String(), "4s"},
		{"replication (env over default)", fs.Lookup("replication").Value.String(), "5"},
		{"retention (file over default)", cfg.Retention.String(), "1h0m0s"},
		{"auto-rebalance (file, a JSON bool)", fs.Lookup("auto-rebalance").Value.String(), "true"},
		{"max-lease (default)", cfg.MaxLease.String(), "1h0m0s"},
		{"version (no environment variable)", fs.Lookup("version").Value.String(), "false"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %s, want %s", c.name, c.got, c.want)
		}
	}

	fs = flag.NewFlagSet("nornd", flag.ContinueOnError)
	defineFlags(fs, &node.Config{})
	err := applyEnv(fs, []string{"NORN_SKEW_BUFFER=soon"})
	if err == nil || !strings.Contains(err.Error(), `NORN_SKEW_BUFFER="soon" (-skew-buffer)`) {
		t.Errorf("a bad environment value: %v, want an error naming NORN_SKEW_BUFFER and -skew-buffer", err)
	}
}

// TestLogLevels checks -log-format and the levels per component.
func TestLogLevels(t *testing.T) {
	var buf bytes.Buffer
	logger, err := newLogger(&buf, "json", "warn,dispatch=debug")
	if err != nil {
		t.Fatal(err)
	}
	logger.Info("root info")
	logger.Warn("root warn")
	logger.With(node.LogComponentKey, "dispatch").Debug("dispatch debug")
	logger.With(node.LogComponentKey, "coord").Info("coord info")
	logger.With(node.LogComponentKey, "coord").Error("coord error")
	var got []string
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("-log-format json wrote a line that is not JSON: %q", line)
		}
		got = append(got, rec["msg"].(string))
	}
	if want := []string{"root warn", "dispatch debug", "coord error"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("logged %q, want %q", got, want)
	}

	buf.Reset()
	logger, err = newLogger(&buf, "text", "info")
	if err != nil {
		t.Fatal(err)
	}
	logger.With(node.LogComponentKey, "server").Info("hello", "k", 1)
	if s := buf.String(); !strings.Contains(s, "level=INFO msg=hello component=server k=1") {
		t.Errorf("text log line %q", s)
	}

	for _, bad := range []struct{ format, levels, want string }{
		{"xml", "info", `-log-format "xml"`},
		{"text", "loud", `-log-level: "loud"`},
		{"text", "info,nosuch=debug", `unknown component "nosuch"`},
		{"text", "info,warn", "a second default level"},
	} {
		if _, err := newLogger(&buf, bad.format, bad.levels); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("newLogger(%q, %q): %v, want an error with %q", bad.format, bad.levels, err, bad.want)
		}
	}
}

// TestVersion checks nornd -version, and that the link-time version
// deploy/Dockerfile sets (-X main.version) replaces the module's.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"-version", "--version"} {
		out, err := exec.Command(norndBin, arg).CombinedOutput()
		if err != nil || !regexp.MustCompile(`^nornd \S+.* go1\.\d+`).Match(out) {
			t.Errorf("nornd %s: %q, %v; want nornd <version> ... go1.N", arg, out, err)
		}
	}
	bin := filepath.Join(t.TempDir(), "nornd")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-test", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "nornd v9.8.7-test ") {
		t.Errorf("nornd built with -X main.version=v9.8.7-test: -version printed %q (%v)", out, err)
	}
}

// TestLogTraceIDs: nornd's log lines written under a traced request's
// context carry its trace_id and span_id, in both formats, and the
// levels per component still apply.
func TestLogTraceIDs(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	var buf bytes.Buffer
	logger, err := newLogger(&buf, "json", "info,coord=warn")
	if err != nil {
		t.Fatal(err)
	}
	logger.With(node.LogComponentKey, "server").InfoContext(ctx, "traced")
	logger.With(node.LogComponentKey, "coord").InfoContext(ctx, "below coord's level")
	logger.With(node.LogComponentKey, "server").InfoContext(context.Background(), "untraced")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("logged %q", lines)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["trace_id"] != "4bf92f3577b34da6a3ce929d0e0e4736" || rec["span_id"] != "00f067aa0ba902b7" || rec["component"] != "server" {
		t.Errorf("traced line %v", rec)
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("untraced line %s", lines[1])
	}
	buf.Reset()
	if logger, err = newLogger(&buf, "text", "info"); err != nil {
		t.Fatal(err)
	}
	logger.InfoContext(ctx, "hello")
	if s := buf.String(); !strings.Contains(s, "msg=hello trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7") {
		t.Errorf("text log line %q", s)
	}
}
