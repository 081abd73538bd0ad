// Package testhooks says whether this binary was built with the test
// hooks of the Jepsen harness: the build tag testhooks (go build -tags
// testhooks) sets Built, and every seeded bug (nornd -test-bug) and test
// hook (/test/clock, /test/crash, faultfs under Pebble) is guarded by it.
// A release build (no tag) has Built false as a constant, so the compiler
// drops the guarded code: no input can turn a seeded bug on, and the
// hooks' routes and flags do not exist (cmd/nornd's TestReleaseHasNoTestHooks
// checks the binary).
package testhooks

// BugCases are the settings of a seeded bug a test can try: off, and on
// only in a build with the hooks (make test builds with them; a plain go
// test tries the bug off alone).
func BugCases() []bool {
	if Built {
		return []bool{false, true}
	}
	return []bool{false}
}
