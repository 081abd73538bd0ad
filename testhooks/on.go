//go:build testhooks

package testhooks

// Built is true: this binary carries the test hooks and seeded bugs.
const Built = true
