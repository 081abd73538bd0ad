//go:build race

package ring

// raceEnabled is true when the race detector is on; the property tests run
// fewer iterations then.
const raceEnabled = true
