package client_test

import (
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// uniqueHolderLocked is the task of the fake that holds spec's unique
// key, other than id, while it is not finished (the fake has no
// windows); 0 when none does. f.mu is held.
func (f *fakeServer) uniqueHolderLocked(spec *nornv1.TaskSpec, id uint64) uint64 {
	if spec.GetUniqueKey() == "" {
		return 0
	}
	for _, t := range f.tasks {
		if t.id != id && t.spec.GetQueue() == spec.GetQueue() && t.spec.GetUniqueKey() == spec.GetUniqueKey() && !finished(t.status) {
			return t.id
		}
	}
	return 0
}

func finished(s nornv1.TaskStatus) bool {
	switch s {
	case nornv1.TaskStatus_TASK_STATUS_COMPLETED, nornv1.TaskStatus_TASK_STATUS_ABORTED,
		nornv1.TaskStatus_TASK_STATUS_CANCELLED, nornv1.TaskStatus_TASK_STATUS_DEAD:
		return true
	}
	return false
}
