package client

import (
	"sync"
	"time"
)

// maxHints bounds the claim hints a client keeps: tasks claimed and not
// yet finished. Past it, a new hint replaces an arbitrary old one (a lost
// hint costs the server one forward, and a call on the claim a shorter
// retry window, nothing else).
const maxHints = 100_000

// claimHints remembers, per claimed task, the API address of the node
// that leads its partition (ClaimedTask.leader), so that Renew, Update,
// Complete, Abort and Yield go straight there instead of being forwarded
// by whichever node the client would pick, and when the claim's lease
// runs out (ClaimedTask.expiry, then each Renew's), which bounds how long
// those calls are retried (callClaim).
type claimHints struct {
	mu sync.Mutex
	m  map[uint64]claimHint
}

// claimHint is what a client knows of one of its claims.
type claimHint struct {
	leader string    // "" when unknown
	expiry time.Time // zero when unknown
}

// note records a claimed task's leader and lease expiry.
func (h *claimHints) note(id uint64, leader string, expiry time.Time) {
	if leader == "" && expiry.IsZero() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[uint64]claimHint{}
	}
	if _, ok := h.m[id]; !ok && len(h.m) >= maxHints {
		for old := range h.m {
			delete(h.m, old)
			break
		}
	}
	h.m[id] = claimHint{leader: leader, expiry: expiry}
}

// renewed records the new expiry of a claim a Renew extended.
func (h *claimHints) renewed(id uint64, expiry time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hint, ok := h.m[id]; ok {
		hint.expiry = expiry
		h.m[id] = hint
	}
}

// get returns id's hint, zero if none; done drops it (the claim is over:
// complete, abort, yield).
func (h *claimHints) get(id uint64, done bool) claimHint {
	h.mu.Lock()
	defer h.mu.Unlock()
	hint := h.m[id]
	if done {
		delete(h.m, id)
	}
	return hint
}
