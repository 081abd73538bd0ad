package transport

import (
	"runtime"
	"sync"
	"testing"
)

// Calls one after another run on the worker the first one started: the
// pool does not grow with the number of calls.
func TestGoReusesIdleWorkers(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 1000 {
		done := make(chan struct{})
		Go(func() { close(done) })
		<-done
	}
	// A worker hands itself back to the pool just after f returns, so a
	// call can find it still busy and start a second one; never many.
	if n := runtime.NumGoroutine(); n > before+3 {
		t.Fatalf("%d goroutines after 1000 calls one after another, %d before", n, before)
	}
}

// Go never waits for a busy worker: calls that block all run at once.
func TestGoNeverQueuesBehindABusyWorker(t *testing.T) {
	const calls = 20
	var started sync.WaitGroup
	started.Add(calls)
	release := make(chan struct{})
	var finished sync.WaitGroup
	finished.Add(calls)
	for range calls {
		Go(func() {
			defer finished.Done()
			started.Done()
			<-release
		})
	}
	started.Wait() // would hang if a call waited for another to end
	close(release)
	finished.Wait()
}
