package client

import "sync"

// maxHints bounds the leader hints a client keeps: tasks claimed and not
// yet finished. Past it, a new hint replaces an arbitrary old one (a lost
// hint costs the server one forward, nothing else).
const maxHints = 100_000

// leaderHints remembers, per claimed task, the API address of the node
// that leads its partition (ClaimedTask.leader), so that Renew, Update,
// Complete, Abort and Yield go straight there instead of being forwarded
// by whichever node the client would pick.
type leaderHints struct {
	mu sync.Mutex
	m  map[uint64]string
}

// note records the leaders of claimed tasks.
func (h *leaderHints) note(id uint64, leader string) {
	if leader == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[uint64]string{}
	}
	if _, ok := h.m[id]; !ok && len(h.m) >= maxHints {
		for old := range h.m {
			delete(h.m, old)
			break
		}
	}
	h.m[id] = leader
}

// get returns id's leader hint, "" if none; done drops it (the claim is
// over: complete, abort, yield).
func (h *leaderHints) get(id uint64, done bool) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	leader := h.m[id]
	if done {
		delete(h.m, id)
	}
	return leader
}
