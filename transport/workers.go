package transport

import "time"

// Go runs f on a goroutine of the node's shared worker pool: one that an
// earlier f left idle, when one waits, else a new one. It never blocks
// and never queues f behind another call.
//
// A worker keeps the stack its earlier calls grew, so a call that goes
// deep (a proto decode, a Pebble commit, a Raft proposal) does not grow a
// fresh goroutine's 2 KiB stack again, copying it at each doubling: under
// claim+complete that copying was 5-7% of a node's CPU, most of it in the
// goroutines of framed calls (docs/BENCHMARKS.md, session 20). A worker
// idle for workerIdle exits; the garbage collector shrinks the stacks of
// those left idle, so the pool holds no memory a quiet node would miss.
//
// Use it for short calls on the hot paths only; a goroutine that runs for
// the life of something (a loop, a connection) should be its own.
func Go(f func()) {
	select {
	case idleWorkers <- f:
	default:
		go work(f)
	}
}

// workerIdle is how long a worker waits for another call before it exits.
const workerIdle = 5 * time.Second

// idleWorkers hands a call to a worker that waits for one; unbuffered, so
// a call is never left waiting for a worker that is busy.
var idleWorkers = make(chan func())

func work(f func()) {
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		f()
		f = nil // let the garbage collector have it while idle
		t.Reset(workerIdle)
		select {
		case f = <-idleWorkers:
		case <-t.C:
			return
		}
	}
}
