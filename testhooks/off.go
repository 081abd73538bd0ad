//go:build !testhooks

package testhooks

// Built is false: a release build, without test hooks or seeded bugs.
const Built = false
