package storage

// The delayed index's moves outside a claim FSM entry: a retry's
// backoff the index missed, and the promotion of tasks whose time came.

// DelayTasks moves tasks of partition p that wait in the ready or
// delayed index to the delayed index until their marks' times (a retry's
// backoff the claim FSM recorded while the task's state had not reached
// this replica yet, found when the leader picks it: the index catches up
// with the FSM). Claimed, terminal and unknown tasks are left alone.
func (s *Store) DelayTasks(p uint16, marks []ClaimMark) error {
	ids := make([]uint64, len(marks))
	for i, m := range marks {
		ids[i] = m.ID
	}
	return s.commitMoves(p, ids, func(b *sortedBatch) ([]indexChange, error) {
		var moves []IndexMove
		for _, m := range marks {
			ti, err := s.loadIndex(p, m.ID)
			if err != nil {
				return nil, err
			}
			if ti.m.state == IndexReady || ti.m.state == IndexDelayed {
				moves = append(moves, IndexMove{ID: m.ID, DelayUntilMs: m.ExpiryMs})
			}
		}
		return s.moveClaims(b, p, moves)
	}, nil)
}

// PromoteDelayed moves up to limit delayed tasks of partition p whose
// not-before time has passed into the ready index, and returns how many it
// moved.
func (s *Store) PromoteDelayed(p uint16, limit int) (int, error) {
	now := s.clock.Now().UnixMilli()
	due, err := s.DelayedDue(p, now, limit)
	if err != nil || len(due) == 0 {
		return 0, err
	}
	ids := make([]uint64, len(due))
	for i, d := range due {
		ids[i] = d.ID
	}
	moved := 0
	err = s.commitMoves(p, ids, func(b *sortedBatch) ([]indexChange, error) {
		var changes []indexChange
		for _, id := range ids {
			ti, err := s.loadIndex(p, id)
			if err != nil {
				return nil, err
			}
			if ti.m.state != IndexDelayed || ti.task.Spec.NotBeforeMs > now || ti.m.dueMs > now {
				continue // claimed or promoted meanwhile
			}
			if err := b.recount(p, id, ti.task, ti.m, ti.task, meta{state: IndexReady}); err != nil {
				return nil, err
			}
			ch, err := s.moveIndex(b, p, id, ti.m, ti.task.Spec, meta{state: IndexReady}, ti.task.Spec, ti.metaFound)
			if err != nil {
				return nil, err
			}
			changes = append(changes, ch...)
			moved++
		}
		return changes, nil
	}, nil)
	return moved, err
}
