package node

import (
	"context"
	"encoding/base64"
	"encoding/binary"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// Listing bounds.
const (
	defaultPageSize = 100
	maxPageSize     = 1000
	maxScanPerPage  = 10_000 // tasks examined per ListTasks call
)

func (s taskService) ListTasks(_ context.Context, req *connect.Request[nornv1.ListTasksRequest]) (*connect.Response[nornv1.ListTasksResponse], error) {
	n, m := s.n, req.Msg
	if q := m.GetQueue(); q != "" {
		if err := crdt.ValidateQueue("queue", q); err != nil {
			return nil, apiError(err)
		}
	}
	size := int(m.GetPageSize())
	if size == 0 {
		size = defaultPageSize
	}
	if size > maxPageSize {
		return nil, invalid("pageSize", "must be at most %d, got %d", maxPageSize, size)
	}
	if _, ok := nornv1.TaskStatus_name[int32(m.GetStatus())]; !ok {
		return nil, invalid("status", "unknown status %d", m.GetStatus())
	}
	p, start, err := decodePageToken(m.GetPageToken(), n.cfg.Partitions)
	if err != nil {
		return nil, err
	}
	var tasks []*nornv1.Task
	scanned := 0
	for ; int(p) < n.cfg.Partitions; p, start = p+1, 0 {
		for {
			batch, next, more, err := n.store.ScanTasks(p, start, 256)
			if err != nil {
				return nil, apiError(err)
			}
			for _, st := range batch {
				scanned++
				if len(tasks) == size || scanned > maxScanPerPage {
					tok := encodePageToken(p, st.Task.ID)
					return connect.NewResponse(&nornv1.ListTasksResponse{Tasks: tasks, NextPageToken: tok}), nil
				}
				if v := n.listView(st, m.GetQueue(), m.GetStatus()); v != nil {
					tasks = append(tasks, v)
				}
			}
			if !more {
				break
			}
			start = next
		}
	}
	return connect.NewResponse(&nornv1.ListTasksResponse{Tasks: tasks}), nil
}

// listView renders a stored task if it matches the filters.
func (n *Node) listView(st *storage.StoredTask, queue string, status nornv1.TaskStatus) *nornv1.Task {
	if st.Task.Spec == nil || (queue != "" && st.Task.Spec.Queue != queue) {
		return nil
	}
	ts, err := n.withClaims(st.Partition, st.Task)
	if err != nil {
		return nil
	}
	v := n.view(ts)
	if status != nornv1.TaskStatus_TASK_STATUS_UNSPECIFIED && v.Status != status {
		return nil
	}
	return v
}

func encodePageToken(p uint16, id uint64) string {
	b := binary.BigEndian.AppendUint16(nil, p)
	return base64.RawURLEncoding.EncodeToString(binary.BigEndian.AppendUint64(b, id))
}

func decodePageToken(tok string, partitions int) (uint16, uint64, error) {
	if tok == "" {
		return 0, 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != 10 || int(binary.BigEndian.Uint16(b)) >= partitions {
		return 0, 0, invalid("pageToken", "not a token from a previous ListTasks")
	}
	return binary.BigEndian.Uint16(b), binary.BigEndian.Uint64(b[2:]), nil
}

func (s taskService) CountTasks(_ context.Context, req *connect.Request[nornv1.CountTasksRequest]) (*connect.Response[nornv1.CountTasksResponse], error) {
	n := s.n
	if q := req.Msg.GetQueue(); q != "" {
		if err := crdt.ValidateQueue("queue", q); err != nil {
			return nil, apiError(err)
		}
	}
	resp := &nornv1.CountTasksResponse{ByStatus: map[string]uint64{}}
	for p := range n.cfg.Partitions {
		counts, err := n.countPartition(uint16(p), req.Msg.GetQueue())
		if err != nil {
			return nil, apiError(err)
		}
		for k, v := range counts {
			resp.ByStatus[k] += v
			resp.Total += v
		}
	}
	return connect.NewResponse(resp), nil
}

// countPartition counts partition p's tasks (of queue, or all) by status
// name. It scans the partition.
func (n *Node) countPartition(p uint16, queue string) (map[string]uint64, error) {
	counts := map[string]uint64{}
	now := n.cfg.Clock.Now().UnixMilli()
	var start uint64
	for {
		batch, next, more, err := n.store.ScanTasks(p, start, 1024)
		if err != nil {
			return nil, err
		}
		for _, st := range batch {
			if st.Task.Spec == nil || (queue != "" && st.Task.Spec.Queue != queue) {
				continue
			}
			ts, err := n.withClaims(p, st.Task)
			if err != nil {
				return nil, err
			}
			counts[statusName(ts.status(now, n.depsDone))]++
		}
		if !more {
			return counts, nil
		}
		start = next
	}
}

// statusName is a status without its enum prefix ("READY").
func statusName(s nornv1.TaskStatus) string {
	return s.String()[len("TASK_STATUS_"):]
}
