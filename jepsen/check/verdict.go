package check

import (
	"fmt"
	"strings"
)

// Verdict is one checker's result.
type Verdict struct {
	Checker string         `json:"checker"`
	Valid   bool           `json:"valid"`
	Skipped string         `json:"skipped,omitempty"` // why the checker did not run
	Counts  map[string]int `json:"counts,omitempty"`
	Details []string       `json:"details,omitempty"` // the first few anomalies
	// ReportOnly: the scenario reports this checker's anomalies without
	// failing (its faults go beyond the promise the checker tests).
	ReportOnly bool `json:"report_only,omitempty"`
}

// Addf adds an anomaly to the details, formatted as fmt.Sprintf does; only
// the first 20 are kept.
func (v *Verdict) Addf(format string, args ...any) {
	if len(v.Details) < 20 {
		v.Details = append(v.Details, fmt.Sprintf(format, args...))
	}
}

// Status is the verdict in one word.
func (v *Verdict) Status() string {
	switch {
	case v.Skipped != "":
		return "skipped"
	case v.Valid:
		return "pass"
	case v.ReportOnly:
		return "reported"
	}
	return "FAIL"
}

// Summary formats verdicts as a table row.
func Summary(vs []Verdict) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "%s=%s ", v.Checker, v.Status())
	}
	return strings.TrimSpace(b.String())
}
