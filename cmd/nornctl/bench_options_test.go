package main

import (
	"testing"
	"time"
)

// TestBenchCompleteBatching: with --pipeline 1 and no --complete-linger
// the bench leaves completes to the client's default (no complete batching
// option); any other setting gives one.
func TestBenchCompleteBatching(t *testing.T) {
	for _, tc := range []struct {
		pipeline  int
		linger    time.Duration
		lingerSet bool
		want      bool // a WithCompleteBatching option is passed
	}{
		{pipeline: 1, linger: time.Millisecond, want: false},
		{pipeline: 1, linger: time.Millisecond, lingerSet: true, want: true},
		{pipeline: 1, linger: 0, lingerSet: true, want: true},
		{pipeline: 16, linger: time.Millisecond, want: true},
		{pipeline: 16, linger: 0, lingerSet: true, want: true},
	} {
		cfg := benchConfig{Pipeline: tc.pipeline, CompLinger: tc.linger, BatchLinger: time.Millisecond, BatchMax: 500}
		got := len(cfg.clientOptions(tc.lingerSet)) == 2
		if got != tc.want {
			t.Errorf("pipeline %d, linger %v (set %v): complete batching option %v, want %v", tc.pipeline, tc.linger, tc.lingerSet, got, tc.want)
		}
	}
}
