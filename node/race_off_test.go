//go:build !race

package node

// raceDetector reports whether the tests run under the race detector.
const raceDetector = false
