package main

import (
	"fmt"
	"io"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/buildinfo"
)

// version, when set at link time (-ldflags "-X main.version=v1.2.3", as
// deploy/Dockerfile does), overrides the main module's version that Go's
// build information records (buildinfo.Read).
var version string

// runVersion prints nornctl's build (a node's is in nornctl status).
func runVersion(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	if _, err := e.parse(cmd, fs, args, 0, 0); err != nil {
		return err
	}
	info := buildinfo.Read(version)
	return e.emit(info.Proto(), func(w io.Writer) { fmt.Fprintln(w, "nornctl", info) })
}

// formatBuild is a node's build in one line, as buildinfo.Info.String
// (the version alone from a node that does not report its build).
func formatBuild(version string, b *nornv1.BuildInfo) string {
	if b == nil {
		return version
	}
	return buildinfo.FromProto(b).String()
}
