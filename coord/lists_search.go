package coord

import (
	"bytes"
	"slices"
	"strings"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
	"github.com/norn-dev/norn/crdt"
)

// Bounds of ListTasks' search filters.
const (
	maxSearchWorker = 256 // as a claim's worker name
	maxSearchText   = 1024
)

// searchRequest is a request that carries ListTasks' search filters
// (ListTasksRequest and ListPartitionRequest).
type searchRequest interface {
	GetDependsOn() uint64
	GetWorker() string
	GetErrorContains() string
	GetPayloadContains() []byte
}

// search is the part of a list filter that looks into each task: the
// tasks depending on a task, claimed by a worker, with an error text, or
// with a payload holding some bytes. The zero search matches every task.
type search struct {
	dependsOn uint64
	worker    string
	errorText string
	payload   []byte
}

// newSearch validates m's search filters.
func newSearch(m searchRequest) (search, error) {
	s := search{dependsOn: m.GetDependsOn(), worker: m.GetWorker(), errorText: m.GetErrorContains(), payload: m.GetPayloadContains()}
	for _, l := range []struct {
		field    string
		got, max int
	}{{"worker", len(s.worker), maxSearchWorker}, {"errorContains", len(s.errorText), maxSearchText},
		{"payloadContains", len(s.payload), maxSearchText}} {
		if l.got > l.max {
			return search{}, apierr.Invalid(l.field, "must be at most %d bytes, got %d", l.max, l.got)
		}
	}
	return s, nil
}

// fill sets m's search fields to s's (a peer request).
func (s search) fill(m *nornv1.ListPartitionRequest) {
	m.DependsOn, m.Worker, m.ErrorContains, m.PayloadContains = s.dependsOn, s.worker, s.errorText, s.payload
}

// matchesSpec reports whether a task of spec may match s: the filters a
// spec decides, checked before the task's claims are read.
func (s search) matchesSpec(spec *crdt.Spec) bool {
	return (s.dependsOn == 0 || slices.Contains(spec.DependsOn, s.dependsOn)) &&
		(len(s.payload) == 0 || bytes.Contains(spec.Payload, s.payload))
}

// matches reports whether the view v matches s.
func (s search) matches(v *nornv1.Task) bool {
	spec := v.GetSpec()
	if s.dependsOn != 0 && !slices.Contains(spec.GetDependsOn(), s.dependsOn) {
		return false
	}
	if len(s.payload) > 0 && !bytes.Contains(spec.GetPayload(), s.payload) {
		return false
	}
	if s.worker != "" && !slices.ContainsFunc(v.GetClaims(), func(c *nornv1.ClaimInfo) bool { return c.GetWorker() == s.worker }) {
		return false
	}
	return HasErrorText(v, s.errorText)
}

// HasErrorText reports whether t has an error whose code or description
// contains text; every task has the empty text.
func HasErrorText(t *nornv1.Task, text string) bool {
	if text == "" {
		return true
	}
	for _, e := range t.GetErrors() {
		if strings.Contains(e.GetCode(), text) || strings.Contains(e.GetDescription(), text) {
			return true
		}
	}
	return false
}
