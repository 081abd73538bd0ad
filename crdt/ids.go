package crdt

import "time"

// IDEpoch is the start of task ids' time: a task id (sonyflake, as the
// nodes issue them) carries the time since IDEpoch in 10 ms units above
// bit 24.
var IDEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// IDTime returns the time a task id carries (when it was issued, to 10
// ms). An id imported from elsewhere may carry any time.
func IDTime(id uint64) time.Time {
	return IDEpoch.Add(time.Duration(id>>24) * 10 * time.Millisecond)
}
