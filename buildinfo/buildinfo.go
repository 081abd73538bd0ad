package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// Info is how a binary was built. Empty fields were not recorded.
type Info struct {
	Version    string // the link-time version, else the main module's ("(devel)" from a work tree)
	Commit     string // vcs.revision
	CommitTime string // vcs.time, RFC 3339
	Modified   bool   // vcs.modified: the work tree had uncommitted changes
	GoVersion  string // the toolchain's version, "go1.26.0"
}

// Read returns the running binary's build information. version, when not
// empty (a main package's variable set with -ldflags "-X main.version=..."),
// overrides the main module's version.
func Read(version string) Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, version)
}

// fromBuildInfo is Read over a given build information (nil: none).
func fromBuildInfo(bi *debug.BuildInfo, version string) Info {
	info := Info{Version: version, GoVersion: runtime.Version()}
	if bi == nil {
		if info.Version == "" {
			info.Version = "unknown"
		}
		return info
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	if info.Version == "" {
		info.Version = bi.Main.Version
	}
	if info.Version == "" {
		info.Version = "unknown"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
		case "vcs.time":
			info.CommitTime = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is one line: version, then commit, its time and "modified" in
// parentheses when known, then the Go version.
func (i Info) String() string {
	var vcs []string
	if i.Commit != "" {
		c := i.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		vcs = append(vcs, "commit "+c)
	}
	if i.CommitTime != "" {
		vcs = append(vcs, i.CommitTime)
	}
	if i.Modified {
		vcs = append(vcs, "modified")
	}
	s := i.Version
	if len(vcs) > 0 {
		s += " (" + strings.Join(vcs, ", ") + ")"
	}
	return fmt.Sprintf("%s %s", s, i.GoVersion)
}

// Proto is i as the API's BuildInfo (Status's build).
func (i Info) Proto() *nornv1.BuildInfo {
	return &nornv1.BuildInfo{Version: i.Version, Commit: i.Commit, CommitTime: i.CommitTime,
		Modified: i.Modified, GoVersion: i.GoVersion}
}

// FromProto is the Info of an API BuildInfo.
func FromProto(b *nornv1.BuildInfo) Info {
	return Info{Version: b.GetVersion(), Commit: b.GetCommit(), CommitTime: b.GetCommitTime(),
		Modified: b.GetModified(), GoVersion: b.GetGoVersion()}
}
