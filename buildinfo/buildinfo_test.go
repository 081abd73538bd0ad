package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/norn-dev/norn", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "1a2b3c4d5e6f7a8b9c0d"},
			{Key: "vcs.time", Value: "2026-11-25T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
			{Key: "-trimpath", Value: "true"},
		}}
	tests := []struct {
		name    string
		bi      *debug.BuildInfo
		version string
		want    Info
		line    string
	}{
		{"work tree", vcs, "",
			Info{Version: "(devel)", Commit: "1a2b3c4d5e6f7a8b9c0d", CommitTime: "2026-11-25T10:00:00Z", Modified: true, GoVersion: "go1.26.0"},
			"(devel) (commit 1a2b3c4d5e6f, 2026-11-25T10:00:00Z, modified) go1.26.0"},
		{"link-time version wins", vcs, "v0.3.0",
			Info{Version: "v0.3.0", Commit: "1a2b3c4d5e6f7a8b9c0d", CommitTime: "2026-11-25T10:00:00Z", Modified: true, GoVersion: "go1.26.0"},
			"v0.3.0 (commit 1a2b3c4d5e6f, 2026-11-25T10:00:00Z, modified) go1.26.0"},
		{"module download, no vcs", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.2.0"}}, "",
			Info{Version: "v0.2.0", GoVersion: "go1.26.0"}, "v0.2.0 go1.26.0"},
		{"clean tree", &debug.BuildInfo{GoVersion: "go1.26.0", Settings: []debug.BuildSetting{{Key: "vcs.modified", Value: "false"}, {Key: "vcs.revision", Value: "abc"}}}, "",
			Info{Version: "unknown", Commit: "abc", GoVersion: "go1.26.0"}, "unknown (commit abc) go1.26.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fromBuildInfo(tt.bi, tt.version)
			if got != tt.want {
				t.Errorf("fromBuildInfo = %+v, want %+v", got, tt.want)
			}
			if s := got.String(); s != tt.line {
				t.Errorf("String() = %q, want %q", s, tt.line)
			}
		})
	}
	if got := fromBuildInfo(nil, ""); got.Version != "unknown" || got.GoVersion == "" {
		t.Errorf("without build info: %+v, want version unknown and the runtime's Go version", got)
	}
}
