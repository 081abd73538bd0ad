package jepsen

// The test hooks of a node under test (nornd -test-hooks): its clock,
// leadership transfers, task states refused and power loss.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ClockState is the answer of GET /test/clock.
type ClockState struct {
	OffsetMS int64   `json:"offset_ms"`
	Rate     float64 `json:"rate"`
	NowMS    int64   `json:"now_ms"`
}

// SetClock sets n's injected clock (test hooks only): real now + offset
// from now on, advancing at rate (0 means 1).
func (n *Node) SetClock(offset time.Duration, rate float64) error {
	if rate == 0 {
		rate = 1
	}
	if (offset != 0 || rate != 1) && n.clockMoved != nil {
		n.clockMoved.Store(true)
	}
	body, _ := json.Marshal(map[string]any{"offset_ms": offset.Milliseconds(), "rate": rate})
	return n.post("/test/clock", string(body))
}

// TransferLeadership asks n, which must lead task's partition, to hand
// that leadership to node to (test hooks only: POST /test/transfer), and
// returns once n has stepped down or the transfer failed.
func (n *Node) TransferLeadership(task uint64, to string) error {
	body, _ := json.Marshal(map[string]string{"task": fmt.Sprint(task), "to": to})
	return n.post("/test/transfer", string(body))
}

// RefuseStates makes n exchange no task states with its peers (on) or
// exchange them again (off), while its Raft groups go on (test hooks
// only: POST /test/refuse-states): it misses writes acked at W < N.
func (n *Node) RefuseStates(on bool) error {
	return n.post("/test/refuse-states", fmt.Sprintf(`{"on": %v}`, on))
}

// Crash asks n to exit at once losing its unsynced writes (test hooks
// only: the power-loss nemesis), and waits for the exit.
func (n *Node) Crash() error {
	err := n.post("/test/crash", "{}")
	n.mu.Lock()
	cmd, done := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return err
	}
	select {
	case <-done:
		n.mu.Lock()
		n.cmd = nil
		n.mu.Unlock()
		return nil
	case <-time.After(5 * time.Second):
		n.Kill()
		return fmt.Errorf("%s did not exit after /test/crash (%v); killed", n.ID, err)
	}
}

func (n *Node) post(path, body string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.url(path), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := n.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("POST %s on %s: %s", path, n.ID, resp.Status)
	}
	return nil
}
