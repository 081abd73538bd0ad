package check

import (
	"context"
	"testing"
	"time"
)

// TestWaitOK: WaitOK returns once enough ops succeeded (fails and infos do
// not count), and false when ctx ends first.
func TestWaitOK(t *testing.T) {
	h := NewHistory()
	h.Add(&Op{F: "claim", Type: "fail"})
	h.Add(&Op{F: "enqueue", Type: "info"})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if h.WaitOK(ctx, 1) {
		t.Fatal("WaitOK returned true without an ok op")
	}
	go func() {
		for range 3 {
			h.Add(&Op{F: "enqueue", Type: "ok"})
		}
	}()
	if !h.WaitOK(context.Background(), 3) {
		t.Fatal("WaitOK did not see 3 ok ops")
	}
}
