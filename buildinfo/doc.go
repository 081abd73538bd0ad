// Package buildinfo tells how the running binary was built: its version,
// the VCS commit and commit time, whether the work tree was modified, and
// the Go version, from runtime/debug.ReadBuildInfo. nornd reports it with
// -version and in Status; nornctl with `nornctl version`.
//
//	info := buildinfo.Read(version) // version: main's -X main.version, or ""
//	fmt.Println(info)               // "v0.3.0 (commit 1a2b3c4d5e6f, 2026-11-25T10:00:00Z, modified) go1.26.0"
//
// Go records the commit and its time (vcs.revision, vcs.time,
// vcs.modified) when it builds a main package inside a VCS work tree
// (not with -buildvcs=false, and not in a build from a module download);
// the build's own time is not recorded, so that builds stay reproducible.
package buildinfo
