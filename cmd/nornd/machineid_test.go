package main

import "testing"

// TestMachineIDFromNodeID: -machine-id-from-node-id takes 1 + the number
// a node id ends with, and refuses ids without one or beyond 16 bits.
func TestMachineIDFromNodeID(t *testing.T) {
	for _, tc := range []struct {
		id      string
		want    uint
		wantErr bool
	}{
		{"norn-0", 1, false},
		{"norn-4", 5, false},
		{"n12", 13, false},
		{"7", 8, false},
		{"norn-007", 8, false},
		{"norn-2a", 0, true},
		{"norn", 0, true},
		{"", 0, true},
		{"norn-70000", 0, true},
	} {
		got, err := machineIDFromNodeID(tc.id)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("machineIDFromNodeID(%q) = %d, %v; want %d, error %v", tc.id, got, err, tc.want, tc.wantErr)
		}
	}
}
