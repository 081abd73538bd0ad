// Command dashcheck checks the Grafana dashboard of deploy/grafana and
// the metric names the dashboard and the alerting rules use, for
// scripts/promtool.sh (make lint):
//
//	dashcheck -dashboard norn.json -docs OPERATIONS.md -rules-out FILE [rules.yaml...]
//
// It checks that the dashboard is JSON of the shape Grafana imports (a
// uid, a schemaVersion, a datasource variable every query uses, panels
// with unique ids on the 24-column grid without overlapping, targets with
// unique refIds), that every $variable a query names is defined, and that
// every norn_ series the dashboard and the rule files name is one of the
// Metrics section of docs/OPERATIONS.md (a histogram's _bucket, _sum and
// _count included). It writes every query, its variables replaced by
// values of their kind, as a recording rule to FILE, for `promtool check
// rules` to parse: this module stays free of the Prometheus module.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

func main() {
	dashboard := flag.String("dashboard", "", "Grafana dashboard JSON")
	docs := flag.String("docs", "", "docs/OPERATIONS.md, whose Metrics section lists the series")
	rulesOut := flag.String("rules-out", "", "file to write the dashboard's queries to, as Prometheus recording rules")
	flag.Parse()
	if *dashboard == "" || *docs == "" || *rulesOut == "" {
		fmt.Fprintln(os.Stderr, "usage: dashcheck -dashboard norn.json -docs OPERATIONS.md -rules-out FILE [rules.yaml...]")
		os.Exit(2)
	}
	if err := run(*dashboard, *docs, *rulesOut, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "dashcheck:", err)
		os.Exit(1)
	}
}

func run(dashboardPath, docsPath, rulesOut string, ruleFiles []string) error {
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		return err
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w", dashboardPath, err)
	}
	doc, err := os.ReadFile(docsPath)
	if err != nil {
		return err
	}
	known, err := documentedSeries(string(doc))
	if err != nil {
		return fmt.Errorf("%s: %w", docsPath, err)
	}
	var errs []error
	for _, e := range checkDashboard(d) {
		errs = append(errs, fmt.Errorf("%s: %w", dashboardPath, e))
	}
	var rules strings.Builder
	rules.WriteString("# The queries of " + dashboardPath + ", written by dashcheck for promtool check rules.\ngroups:\n  - name: dashboard\n    rules:\n")
	for _, p := range d.allPanels() {
		for _, t := range p.Targets {
			expr := substitute(t.Expr, d.variables())
			// A JSON string is a YAML double-quoted scalar.
			q, _ := json.Marshal(expr)
			fmt.Fprintf(&rules, "      - record: dashboard:panel_%d:%s\n        expr: %s\n", p.ID, t.RefID, q)
			for _, name := range unknownSeries(t.Expr, known) {
				errs = append(errs, fmt.Errorf("%s: panel %d %q, query %s: %s is no series of %s", dashboardPath, p.ID, p.Title, t.RefID, name, docsPath))
			}
		}
	}
	for _, f := range ruleFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, name := range unknownSeries(string(b), known) {
			errs = append(errs, fmt.Errorf("%s: %s is no series of %s", f, name, docsPath))
		}
	}
	if err := os.WriteFile(rulesOut, []byte(rules.String()), 0o644); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// dashboard is the part of a Grafana dashboard's JSON model checked.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	GridPos    gridPos     `json:"gridPos"`
	Datasource *datasource `json:"datasource"`
	Targets    []target    `json:"targets"`
	Panels     []panel     `json:"panels"` // a collapsed row's
}

type gridPos struct{ X, Y, W, H int }

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type variable struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Query any    `json:"query"`
}

// datasourceRef is what every panel and query names as its data source:
// the dashboard's variable of type datasource, named datasource.
const datasourceRef = "${datasource}"

// minSchemaVersion is the oldest schemaVersion accepted (Grafana 10).
const minSchemaVersion = 36

// allPanels lists the panels, those of collapsed rows included.
func (d dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// variables maps each template variable's name to its type.
func (d dashboard) variables() map[string]string {
	m := map[string]string{}
	for _, v := range d.Templating.List {
		m[v.Name] = v.Type
	}
	return m
}

// checkDashboard returns what is wrong with d's shape.
func checkDashboard(d dashboard) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if d.UID == "" || d.Title == "" {
		bad("no uid or title")
	}
	if d.SchemaVersion < minSchemaVersion {
		bad("schemaVersion %d, want %d or later", d.SchemaVersion, minSchemaVersion)
	}
	vars := d.variables()
	if vars["datasource"] != "datasource" {
		bad("no variable datasource of type datasource")
	}
	ids := map[int]bool{}
	var placed []panel
	for _, p := range d.allPanels() {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 || ids[p.ID] {
			bad("%s: id missing or used twice", where)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			bad("%s: gridPos %+v outside the 24 columns", where, g)
		}
		for _, q := range placed {
			if overlap(p.GridPos, q.GridPos) {
				bad("%s overlaps panel %d %q", where, q.ID, q.Title)
			}
		}
		placed = append(placed, p)
		if p.Type == "row" || p.Type == "text" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != datasourceRef {
			bad("%s: datasource is not %s", where, datasourceRef)
		}
		if len(p.Targets) == 0 {
			bad("%s: no query", where)
		}
		refs := map[string]bool{}
		for _, t := range p.Targets {
			if t.RefID == "" || refs[t.RefID] || strings.TrimSpace(t.Expr) == "" {
				bad("%s: query %q without expr, or its refId missing or used twice", where, t.RefID)
			}
			refs[t.RefID] = true
			if t.Datasource == nil || t.Datasource.UID != datasourceRef {
				bad("%s, query %s: datasource is not %s", where, t.RefID, datasourceRef)
			}
			for _, name := range referencedVariables(t.Expr) {
				if _, ok := vars[name]; !ok && builtins[name] == "" {
					bad("%s, query %s: $%s is not defined", where, t.RefID, name)
				}
			}
		}
	}
	return errs
}

// overlap reports whether two grid positions share a cell.
func overlap(a, b gridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// builtins are Grafana's variables a query may use, with the value
// substitute gives them.
var builtins = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}

// variableRef matches $name and ${name} (with ${name:format}).
var variableRef = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)`)

// referencedVariables lists the variables expr names, in order.
func referencedVariables(expr string) []string {
	var out []string
	for _, m := range variableRef.FindAllStringSubmatch(expr, -1) {
		out = append(out, m[1]+m[2])
	}
	return out
}

// substitute replaces expr's variables: Grafana's intervals by durations,
// the dashboard's own by ".*" (they sit in label matchers). An unknown
// variable is left as it is, for the parser to refuse.
func substitute(expr string, vars map[string]string) string {
	return variableRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2]
		if v, ok := builtins[name]; ok {
			return v
		}
		if _, ok := vars[name]; ok {
			return ".*"
		}
		return ref
	})
}

// seriesName matches a Norn series name.
var seriesName = regexp.MustCompile(`\bnorn_[a-z0-9_]*[a-z0-9]`)

// histogramSuffixes are the series a classic histogram adds to its name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// documentedSeries returns the norn_ names of the Metrics section of
// docs/OPERATIONS.md, up to its changelog of old names, each with its
// type: the second cell of a table row that names it first ("counter",
// "gauge", "histogram"), or "" for a name the prose mentions.
func documentedSeries(doc string) (map[string]string, error) {
	start := strings.Index(doc, "\n## Metrics\n")
	if start < 0 {
		return nil, errors.New(`no section "## Metrics"`)
	}
	section := doc[start:]
	if end := strings.Index(section, "\n### Changelog of metric names"); end >= 0 {
		section = section[:end]
	} else if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	known := map[string]string{}
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, "|")
		if strings.HasPrefix(line, "|") && len(cells) > 3 {
			for _, name := range seriesName.FindAllString(cells[1], -1) {
				known[name] = strings.TrimSpace(cells[2])
			}
		}
		for _, name := range seriesName.FindAllString(line, -1) {
			if _, ok := known[name]; !ok {
				known[name] = ""
			}
		}
	}
	if len(known) == 0 {
		return nil, errors.New("no norn_ series in the Metrics section")
	}
	return known, nil
}

// unknownSeries lists the norn_ names in text that known lacks, once
// each; a histogram's _bucket, _sum and _count are known with it.
func unknownSeries(text string, known map[string]string) []string {
	var out []string
	for _, name := range seriesName.FindAllString(text, -1) {
		_, ok := known[name]
		for _, s := range histogramSuffixes {
			if b, cut := strings.CutSuffix(name, s); cut && known[b] == "histogram" {
				ok = true
			}
		}
		if !ok && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}
