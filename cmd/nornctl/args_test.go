package main

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

func TestParseNotBefore(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in      string
		want    time.Time
		wantErr bool
	}{
		{"", time.Time{}, false},
		{"5m", now.Add(5 * time.Minute), false},
		{"0s", now, false},
		{"1h30m", now.Add(90 * time.Minute), false},
		{"2026-03-01T10:00:00Z", time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC), false},
		{"2026-03-01T10:00:00.5+02:00", time.Date(2026, 3, 1, 8, 0, 0, 5e8, time.UTC), false},
		{"-5m", time.Time{}, true},
		{"5", time.Time{}, true},
		{"tomorrow", time.Time{}, true},
		{"2026-03-01", time.Time{}, true},
	}
	for _, tc := range tests {
		got, err := parseNotBefore(tc.in, now)
		if (err != nil) != tc.wantErr || !got.Equal(tc.want) {
			t.Errorf("parseNotBefore(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseNode(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{"n1", "n1", false},
		{" n1\n", "n1", false},
		{"10.0.0.4:7400", "10.0.0.4:7400", false},
		{"[::1]:7400", "[::1]:7400", false},
		{"node-4.example.com:7400", "node-4.example.com:7400", false},
		{"", "", true},
		{"  ", "", true},
		{"http://10.0.0.4:7400", "", true},
		{"n 1", "", true},
	}
	for _, tc := range tests {
		got, err := parseNode(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseNode(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseIDs(t *testing.T) {
	tests := []struct {
		in      string
		want    []uint64
		wantErr bool
	}{
		{"", nil, false},
		{"  ", nil, false},
		{"7", []uint64{7}, false},
		{"1,2, 3", []uint64{1, 2, 3}, false},
		{"18446744073709551615", []uint64{18446744073709551615}, false},
		{"18446744073709551616", nil, true},
		{"0", nil, true},
		{"1,,2", nil, true},
		{"1,x", nil, true},
		{"-1", nil, true},
		{"1,", nil, true},
	}
	for _, tc := range tests {
		got, err := parseIDs("--depends-on", tc.in)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("parseIDs(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseStatus(t *testing.T) {
	tests := []struct {
		in      string
		want    nornv1.TaskStatus
		wantErr bool
	}{
		{"", nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED, false},
		{"READY", nornv1.TaskStatus_TASK_STATUS_READY, false},
		{"completed", nornv1.TaskStatus_TASK_STATUS_COMPLETED, false},
		{"TASK_STATUS_CANCELLED", nornv1.TaskStatus_TASK_STATUS_CANCELLED, false},
		{"Delayed", nornv1.TaskStatus_TASK_STATUS_DELAYED, false},
		{"UNSPECIFIED", 0, true},
		{"TASK_STATUS_UNSPECIFIED", 0, true},
		{"SLEEPING", 0, true},
		{"3", 0, true},
	}
	for _, tc := range tests {
		got, err := parseStatus(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseStatus(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseInterleaved(t *testing.T) {
	tests := []struct {
		in       string
		wantPos  []string
		wantFlag string
		wantErr  bool
	}{
		{"", nil, "", false},
		{"a b", []string{"a", "b"}, "", false},
		{"--m x a b", []string{"a", "b"}, "x", false},
		{"a --m x b", []string{"a", "b"}, "x", false},
		{"a b -m=x", []string{"a", "b"}, "x", false},
		{"a -- -m x", []string{"a", "-m", "x"}, "", false},
		{"-- -m", []string{"-m"}, "", false},
		{"a - b", []string{"a", "-", "b"}, "", false},
		{"a --nope", nil, "", true},
		{"a --m", nil, "", true},
	}
	for _, tc := range tests {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		m := fs.String("m", "", "")
		pos, err := parseInterleaved(fs, strings.Fields(tc.in))
		if (err != nil) != tc.wantErr {
			t.Errorf("parseInterleaved(%q): error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err == nil && (!slices.Equal(pos, tc.wantPos) || *m != tc.wantFlag) {
			t.Errorf("parseInterleaved(%q) = %q, -m %q; want %q, -m %q", tc.in, pos, *m, tc.wantPos, tc.wantFlag)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   []byte
		want string
	}{
		{nil, "-"},
		{[]byte{}, "-"},
		{[]byte("hello"), `"hello"`},
		{[]byte(`{"a":1}`), `"{\"a\":1}"`},
		{[]byte("héllo"), `"héllo"`},
		{[]byte("line\nbreak"), "<10 bytes>"},
		{[]byte{0xff, 0x00}, "<2 bytes>"},
		{[]byte(strings.Repeat("a", maxShownBytes)), `"` + strings.Repeat("a", maxShownBytes) + `"`},
		{[]byte(strings.Repeat("a", maxShownBytes+1)), "<61 bytes>"},
	}
	for _, tc := range tests {
		if got := formatBytes(tc.in); got != tc.want {
			t.Errorf("formatBytes(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond // 1..100 ms
	}
	tests := []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{[]time.Duration{7}, 50, 7},
		{[]time.Duration{7}, 99, 7},
		{[]time.Duration{1, 2}, 50, 1},
		{[]time.Duration{1, 2}, 51, 2},
		{[]time.Duration{1, 2, 3, 4}, 50, 2},
		{[]time.Duration{1, 2, 3, 4}, 75, 3},
		{[]time.Duration{1, 2, 3, 4}, 100, 4},
		{hundred, 50, 50 * time.Millisecond},
		{hundred, 95, 95 * time.Millisecond},
		{hundred, 99, 99 * time.Millisecond},
		{hundred, 99.5, 100 * time.Millisecond},
		{hundred, 0.5, 1 * time.Millisecond},
	}
	for _, tc := range tests {
		if got := percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("percentile(%d samples, %v) = %v, want %v", len(tc.sorted), tc.p, got, tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	if got := summarize(nil); got != (latencySummary{}) {
		t.Errorf("summarize(nil) = %+v, want zeros", got)
	}
	lat := []time.Duration{4 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	want := latencySummary{P50: 2, P95: 4, P99: 4, Max: 4, Mean: 2.5}
	if got := summarize(lat); got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
}
