// Command k8sschemas writes the JSON schemas kubeconform needs to check
// Kubernetes manifests offline: for every apiVersion and kind the
// manifests use, one strict schema (unknown fields refused) taken from
// the OpenAPI v2 document of a Kubernetes release (api/openapi-spec/
// swagger.json in the module k8s.io/kubernetes, fetched through the Go
// module proxy and checked against the checksum database). The files are
// named as kubeconform's -schema-location template
// DIR/{{.ResourceKind}}{{.KindSuffix}}.json expects
// (statefulset-apps-v1.json, service-v1.json).
//
//	k8sschemas -spec swagger.json -out DIR manifest.yaml...
//
// The conversion is the one of kubeconform's openapi2jsonschema: every
// object with properties gets additionalProperties false unless it
// preserves unknown fields, int-or-string and quantities take a string or
// a number, and each kind's schema carries the definitions it reaches.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	spec := flag.String("spec", "", "Kubernetes OpenAPI v2 document (swagger.json)")
	out := flag.String("out", "", "directory to write the schemas to")
	flag.Parse()
	if *spec == "" || *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: k8sschemas -spec swagger.json -out DIR manifest.yaml...")
		os.Exit(2)
	}
	if err := run(*spec, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "k8sschemas:", err)
		os.Exit(1)
	}
}

// gvk is an apiVersion ("apps/v1", "v1") and kind.
type gvk struct{ apiVersion, kind string }

func run(specPath, out string, manifests []string) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var doc struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	byKind := map[gvk]string{}
	for name, d := range doc.Definitions {
		m, _ := d.(map[string]any)
		list, _ := m["x-kubernetes-group-version-kind"].([]any)
		for _, e := range list {
			g, _ := e.(map[string]any)
			group, _ := g["group"].(string)
			version, _ := g["version"].(string)
			kind, _ := g["kind"].(string)
			av := version
			if group != "" {
				av = group + "/" + version
			}
			byKind[gvk{av, kind}] = name
		}
	}
	for name, d := range doc.Definitions {
		doc.Definitions[name] = strict(name, d)
	}
	used, err := kinds(manifests)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, k := range used {
		name, ok := byKind[k]
		if !ok {
			continue // kubeconform reports the missing schema
		}
		defs := map[string]any{}
		reach(doc.Definitions, doc.Definitions[name], defs)
		root := map[string]any{}
		for key, v := range doc.Definitions[name].(map[string]any) {
			root[key] = v
		}
		root["definitions"] = defs
		b, err := json.Marshal(root)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, fileName(k)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// fileName is kubeconform's {{.ResourceKind}}{{.KindSuffix}}.json.
func fileName(k gvk) string {
	group, version, ok := strings.Cut(k.apiVersion, "/")
	suffix := "-" + strings.ToLower(strings.Split(group, ".")[0])
	if ok {
		suffix += "-" + strings.ToLower(version)
	}
	return strings.ToLower(k.kind) + suffix + ".json"
}

// kinds lists the apiVersion and kind of every document of the manifests
// (top-level "apiVersion:" and "kind:" lines, documents split by "---").
func kinds(paths []string) ([]gvk, error) {
	seen := map[gvk]bool{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		var cur gvk
		flush := func() {
			if cur.apiVersion != "" && cur.kind != "" {
				seen[cur] = true
			}
			cur = gvk{}
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "---"):
				flush()
			case strings.HasPrefix(line, "apiVersion:"):
				cur.apiVersion = strings.Trim(strings.TrimSpace(strings.TrimPrefix(line, "apiVersion:")), `"'`)
			case strings.HasPrefix(line, "kind:"):
				cur.kind = strings.Trim(strings.TrimSpace(strings.TrimPrefix(line, "kind:")), `"'`)
			}
		}
		flush()
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	out := make([]gvk, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].apiVersion+out[i].kind < out[j].apiVersion+out[j].kind })
	return out, nil
}

// strict returns schema s with unknown fields refused and the types that
// YAML writes either way (int-or-string, quantities) widened.
func strict(name string, s any) any {
	switch name {
	case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
	case "io.k8s.apimachinery.pkg.api.resource.Quantity":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
	}
	return walk(s)
}

func walk(s any) any {
	switch v := s.(type) {
	case map[string]any:
		if f, _ := v["format"].(string); f == "int-or-string" {
			return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
		}
		for k, e := range v {
			if k == "properties" {
				props, _ := e.(map[string]any)
				for pk, pv := range props {
					props[pk] = walk(pv)
				}
				continue
			}
			v[k] = walk(e)
		}
		_, hasProps := v["properties"]
		_, hasAdditional := v["additionalProperties"]
		preserve, _ := v["x-kubernetes-preserve-unknown-fields"].(bool)
		if hasProps && !hasAdditional && !preserve {
			v["additionalProperties"] = false
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = walk(e)
		}
		return v
	}
	return s
}

// reach adds to defs every definition s refers to, transitively.
func reach(all map[string]any, s any, defs map[string]any) {
	switch v := s.(type) {
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, "#/definitions/")
			if _, done := defs[name]; !done {
				if d, ok := all[name]; ok {
					defs[name] = d
					reach(all, d, defs)
				}
			}
		}
		for _, e := range v {
			reach(all, e, defs)
		}
	case []any:
		for _, e := range v {
			reach(all, e, defs)
		}
	}
}
