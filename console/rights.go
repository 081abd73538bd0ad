package console

import (
	"slices"
	"strings"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// rights is what the caller may do, from AdminService.WhoAmI: the pages
// show only the actions it may take (the API checks each call anyway).
type rights struct {
	me *nornv1.WhoAmIResponse
}

// all reports whether the caller may call everything: no access control,
// or a node.
func (r rights) all() bool { return r.me == nil || !r.me.AccessControl || r.me.Node != "" }

// has reports whether the caller holds one of roles on queue ("*": on
// every queue).
func (r rights) has(queue string, roles ...string) bool {
	if r.all() {
		return true
	}
	for _, g := range r.me.Grants {
		if slices.Contains(roles, g.Role) && covers(g.Queues, queue) {
			return true
		}
	}
	return false
}

// covers is access.Grant.Covers: names, prefixes ending in "*", "*"; no
// queues means "*". Queue "*" (every queue) needs a "*" grant.
func covers(patterns []string, queue string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		switch {
		case p == "*":
			return true
		case queue == "*":
		case strings.HasSuffix(p, "*") && strings.HasPrefix(queue, strings.TrimSuffix(p, "*")):
			return true
		case p == queue:
			return true
		}
	}
	return false
}

// The actions, by the roles the API gives them (docs/SECURITY.md).
func (r rights) mayAdmin(queue string) bool  { return r.has(queue, "admin") }
func (r rights) mayCancel(queue string) bool { return r.has(queue, "admin", "producer") }
func (r rights) mayRetry(queue string) bool  { return r.has(queue, "admin", "producer", "worker") }
func (r rights) mayList(queue string) bool   { return r.has(queue, "admin", "producer", "reader") }
func (r rights) mayStatus() bool             { return r.hasRole("admin", "reader") }

// hasRole reports whether any grant gives one of roles (on any queue).
func (r rights) hasRole(roles ...string) bool {
	if r.all() {
		return true
	}
	return slices.ContainsFunc(r.me.Grants, func(g *nornv1.Grant) bool { return slices.Contains(roles, g.Role) })
}

// namedQueues lists the queues the caller's grants name exactly (not by
// prefix), for a caller who may not list every queue.
func (r rights) namedQueues() []string {
	var out []string
	if r.me == nil {
		return nil
	}
	for _, g := range r.me.Grants {
		for _, q := range g.Queues {
			if q != "*" && !strings.HasSuffix(q, "*") && !slices.Contains(out, q) {
				out = append(out, q)
			}
		}
	}
	slices.Sort(out)
	return out
}
