package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSubstitute(t *testing.T) {
	vars := map[string]string{"datasource": "datasource", "job": "query", "instance": "query"}
	for _, c := range []struct{ in, want string }{
		{`rate(x{job="$job"}[$__rate_interval])`, `rate(x{job=".*"}[5m])`},
		{`x{instance=~"${instance}"}`, `x{instance=~".*"}`},
		{`x{instance=~"${instance:regex}"}[${__range}]`, `x{instance=~".*"}[1h]`},
		{`x{a="$unknown"}`, `x{a="$unknown"}`}, // left for the parser to refuse
		{`sum(x)`, `sum(x)`},
	} {
		if got := substitute(c.in, vars); got != c.want {
			t.Errorf("substitute(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestUnknownSeries(t *testing.T) {
	known := map[string]string{"norn_rpc_server_duration_seconds": "histogram", "norn_ring_epoch": "gauge"}
	for _, c := range []struct {
		in   string
		want []string
	}{
		{`norn_ring_epoch > 0`, nil},
		{`rate(norn_rpc_server_duration_seconds_bucket[5m])`, nil},
		{`norn_rpc_server_duration_seconds_sum / norn_rpc_server_duration_seconds_count`, nil},
		{`norn_ring_epoch_bucket`, []string{"norn_ring_epoch_bucket"}}, // not a histogram's
		{`norn_ring_epochs + norn_ring_epochs + up`, []string{"norn_ring_epochs"}},
		{`service="norn.v1.TaskService"`, nil},
	} {
		if got := unknownSeries(c.in, known); !slices.Equal(got, c.want) {
			t.Errorf("unknownSeries(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestDocumentedSeries(t *testing.T) {
	doc := "# Ops\n\n`norn_before` here.\n\n## Metrics\n\nSee `norn_prose`.\n\n| series | type |\n|---|---|\n" +
		"| `norn_a_total` | counter |\n| `norn_b_seconds`, `norn_c` | histogram |\n\n" +
		"### Changelog of metric names\n\n| `norn_old` | `norn_a_total` |\n\n## Next\n"
	known, err := documentedSeries(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"norn_a_total": "counter", "norn_b_seconds": "histogram", "norn_c": "histogram", "norn_prose": ""}
	if !maps.Equal(known, want) {
		t.Errorf("documented %v, want %v", known, want)
	}
	if _, err := documentedSeries("# Ops\n\nnorn_x\n"); err == nil {
		t.Error("a document without a Metrics section was accepted")
	}
}

func TestOverlap(t *testing.T) {
	for _, c := range []struct {
		a, b gridPos
		want bool
	}{
		{gridPos{0, 0, 12, 8}, gridPos{12, 0, 12, 8}, false}, // side by side
		{gridPos{0, 0, 12, 8}, gridPos{0, 8, 12, 8}, false},  // one above the other
		{gridPos{0, 0, 12, 8}, gridPos{11, 7, 4, 4}, true},
		{gridPos{0, 0, 24, 1}, gridPos{0, 0, 24, 1}, true},
	} {
		if got := overlap(c.a, c.b); got != c.want {
			t.Errorf("overlap(%+v, %+v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// validDashboard is a dashboard checkDashboard accepts; the cases of
// TestCheckDashboard break one thing each.
func validDashboard() dashboard {
	ds := &datasource{Type: "prometheus", UID: datasourceRef}
	d := dashboard{UID: "norn", Title: "Norn", SchemaVersion: 39}
	d.Templating.List = []variable{{Name: "datasource", Type: "datasource"}, {Name: "instance", Type: "query"}}
	d.Panels = []panel{
		{ID: 1, Type: "row", Title: "Cluster", GridPos: gridPos{0, 0, 24, 1}},
		{ID: 2, Type: "timeseries", Title: "Epoch", GridPos: gridPos{0, 1, 12, 8}, Datasource: ds,
			Targets: []target{{RefID: "A", Expr: `norn_ring_epoch{instance=~"$instance"}`, Datasource: ds}}},
		{ID: 3, Type: "timeseries", Title: "Rate", GridPos: gridPos{12, 1, 12, 8}, Datasource: ds,
			Targets: []target{{RefID: "A", Expr: `rate(norn_x_total[$__rate_interval])`, Datasource: ds}}},
	}
	return d
}

func TestCheckDashboard(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(d *dashboard)
		want   string // in the error; "" for none
	}{
		{"valid", func(*dashboard) {}, ""},
		{"old schema", func(d *dashboard) { d.SchemaVersion = 27 }, "schemaVersion"},
		{"no uid", func(d *dashboard) { d.UID = "" }, "no uid"},
		{"no datasource variable", func(d *dashboard) { d.Templating.List = d.Templating.List[1:] }, "no variable datasource"},
		{"id twice", func(d *dashboard) { d.Panels[2].ID = 2 }, "used twice"},
		{"past the grid", func(d *dashboard) { d.Panels[2].GridPos.W = 13 }, "outside the 24 columns"},
		{"overlapping", func(d *dashboard) { d.Panels[2].GridPos.X = 6 }, "overlaps panel 2"},
		{"fixed datasource", func(d *dashboard) { d.Panels[1].Datasource = &datasource{UID: "abc"} }, "datasource is not"},
		{"query's datasource", func(d *dashboard) { d.Panels[1].Targets[0].Datasource = nil }, "query A: datasource"},
		{"no query", func(d *dashboard) { d.Panels[1].Targets = nil }, "no query"},
		{"refId twice", func(d *dashboard) { d.Panels[1].Targets = append(d.Panels[1].Targets, d.Panels[1].Targets[0]) }, "used twice"},
		{"empty expr", func(d *dashboard) { d.Panels[1].Targets[0].Expr = " " }, "without expr"},
		{"undefined variable", func(d *dashboard) { d.Panels[1].Targets[0].Expr = `x{node="$node"}` }, "$node is not defined"},
	} {
		d := validDashboard()
		c.mutate(&d)
		errs := fmt.Sprint(checkDashboard(d))
		if c.want == "" && errs != "[]" {
			t.Errorf("%s: %s", c.name, errs)
		}
		if c.want != "" && !strings.Contains(errs, c.want) {
			t.Errorf("%s: errors %s, want one saying %q", c.name, errs, c.want)
		}
	}
}

// TestRun: the repository's dashboard and alerting rules pass, and the
// rule file written holds one recording rule per query.
func TestRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "rules.yaml")
	if err := run("../../grafana/norn.json", "../../../docs/OPERATIONS.md", out, []string{"../../prometheus/alerts.yaml"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "- record: dashboard:panel_"); n < 20 {
		t.Errorf("%d queries written, want the dashboard's (dozens)", n)
	}
	if strings.Contains(string(b), "$") {
		t.Errorf("a variable left in the queries:\n%s", b)
	}
}
