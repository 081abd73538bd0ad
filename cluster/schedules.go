package cluster

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/norn-dev/norn/crdt"
)

// Schedules in the meta group (docs/SCHEDULING.md, "Schedules"): their
// definitions and how far each has run. The server reads cron
// expressions and time zones; the group keeps them as the leader gave
// them, validated at the API edge.

// MaxSchedules bounds the schedules: each has a slot, 0 to
// MaxSchedules-1, from which (with a tick's time) its tasks' ids are
// made (ScheduleTaskID).
const MaxSchedules = 2048

// Errors of schedule commands.
var (
	ErrScheduleExists   = errors.New("cluster: a schedule of that name exists")
	ErrNoSchedule       = errors.New("cluster: no schedule of that name")
	ErrTooManySchedules = fmt.Errorf("cluster: at most %d schedules", MaxSchedules)
)

// ScheduleDef is a schedule's definition (the API's Schedule without its
// read-only fields).
type ScheduleDef struct {
	Name       string `json:"name"`
	Cron       string `json:"cron,omitempty"`
	IntervalMs int64  `json:"interval_ms,omitempty"`
	TimeZone   string `json:"tz,omitempty"`
	// Template is the TaskSpec each tick enqueues, in protobuf's binary
	// encoding (the group does not read it).
	Template    []byte `json:"template"`
	JitterMs    int64  `json:"jitter_ms,omitempty"`
	OverlapSkip bool   `json:"overlap_skip,omitempty"`
	CatchUpMs   int64  `json:"catch_up_ms,omitempty"`
	Paused      bool   `json:"paused,omitempty"`
}

// Schedule is a schedule as the group keeps it: its definition, its slot
// and how far it has run.
type Schedule struct {
	ScheduleDef
	Slot      uint16 `json:"slot"`
	CreatedMs int64  `json:"created_ms"`
	// LastTickMs is the last tick run or skipped (0: none yet).
	LastTickMs int64  `json:"last_tick_ms,omitempty"`
	LastTaskID uint64 `json:"last_task_id,omitempty"`
	Skipped    uint64 `json:"skipped,omitempty"`
}

// Schedules is the schedule table. It is never modified once published:
// a command makes a new one.
type Schedules struct {
	// Version is the Raft index of the last change (0: empty).
	Version uint64               `json:"version"`
	ByName  map[string]*Schedule `json:"schedules"`
}

// Get returns the schedule name, or nil.
func (s *Schedules) Get(name string) *Schedule {
	if s == nil {
		return nil
	}
	return s.ByName[name]
}

// Names returns the schedules' names in order.
func (s *Schedules) Names() []string {
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.ByName))
}

// Validate checks a table read from a snapshot.
func (s *Schedules) Validate() error {
	slots := map[uint16]string{}
	for name, sc := range s.ByName {
		if sc == nil || sc.Name != name {
			return fmt.Errorf("cluster: schedule %q: bad entry", name)
		}
		if err := crdt.ValidateQueue("name", name); err != nil {
			return fmt.Errorf("cluster: schedule %q: %w", name, err)
		}
		if sc.Slot >= MaxSchedules {
			return fmt.Errorf("cluster: schedule %q: slot %d", name, sc.Slot)
		}
		if other, dup := slots[sc.Slot]; dup {
			return fmt.Errorf("cluster: schedules %q and %q share slot %d", name, other, sc.Slot)
		}
		slots[sc.Slot] = name
	}
	return nil
}

// with returns a copy of s (nil: empty) with fn applied to its map, at
// version.
func (s *Schedules) with(version uint64, fn func(m map[string]*Schedule)) *Schedules {
	m := map[string]*Schedule{}
	if s != nil {
		maps.Copy(m, s.ByName)
	}
	fn(m)
	return &Schedules{Version: version, ByName: m}
}

// freeSlot returns the lowest slot no schedule of s has.
func (s *Schedules) freeSlot() (uint16, bool) {
	used := make([]bool, MaxSchedules)
	if s != nil {
		for _, sc := range s.ByName {
			used[sc.Slot] = true
		}
	}
	for i, u := range used {
		if !u {
			return uint16(i), true
		}
	}
	return 0, false
}

// ScheduleOp is what a schedule command does.
type ScheduleOp string

// Schedule commands.
const (
	// ScheduleCreate adds Def, created at NowMs, with a free slot.
	ScheduleCreate ScheduleOp = "create"
	// ScheduleUpdate replaces the definition of Def.Name.
	ScheduleUpdate ScheduleOp = "update"
	// SchedulePause sets Name's paused flag to Paused.
	SchedulePause ScheduleOp = "pause"
	// ScheduleDelete removes Name (a no-op when it is gone).
	ScheduleDelete ScheduleOp = "delete"
	// ScheduleRan records that Name's ticks up to TickMs ran: TaskID
	// (when not 0) is the last task one enqueued, Skipped how many were
	// skipped. A tick at or before the last recorded one changes nothing.
	ScheduleRan ScheduleOp = "ran"
)

// ScheduleCommand is one change of the schedule table.
type ScheduleCommand struct {
	Op      ScheduleOp   `json:"op"`
	Def     *ScheduleDef `json:"def,omitempty"`
	Name    string       `json:"name,omitempty"`
	Paused  bool         `json:"paused,omitempty"`
	NowMs   int64        `json:"now_ms,omitempty"`
	TickMs  int64        `json:"tick_ms,omitempty"`
	TaskID  uint64       `json:"task_id,omitempty"`
	Skipped uint64       `json:"skipped,omitempty"`
}

// applySchedule returns the table after c at index, or c's error.
func applySchedule(s *Schedules, c *ScheduleCommand, index uint64) (*Schedules, error) {
	name := c.Name
	if c.Def != nil {
		name = c.Def.Name
	}
	if err := crdt.ValidateQueue("name", name); err != nil {
		return nil, err
	}
	cur := s.Get(name)
	switch c.Op {
	case ScheduleCreate:
		if c.Def == nil {
			return nil, errors.New("cluster: create without a definition")
		}
		if cur != nil {
			return nil, fmt.Errorf("%w: %q", ErrScheduleExists, name)
		}
		slot, ok := s.freeSlot()
		if !ok {
			return nil, ErrTooManySchedules
		}
		return s.with(index, func(m map[string]*Schedule) {
			m[name] = &Schedule{ScheduleDef: *c.Def, Slot: slot, CreatedMs: c.NowMs}
		}), nil
	case ScheduleDelete:
		if cur == nil {
			return s, nil
		}
		return s.with(index, func(m map[string]*Schedule) { delete(m, name) }), nil
	}
	if cur == nil {
		return nil, fmt.Errorf("%w: %q", ErrNoSchedule, name)
	}
	next := *cur
	switch c.Op {
	case ScheduleUpdate:
		if c.Def == nil {
			return nil, errors.New("cluster: update without a definition")
		}
		next.ScheduleDef = *c.Def
	case SchedulePause:
		next.Paused = c.Paused
	case ScheduleRan:
		if c.TickMs <= cur.LastTickMs {
			return s, nil
		}
		next.LastTickMs = c.TickMs
		if c.TaskID != 0 {
			next.LastTaskID = c.TaskID
		}
		next.Skipped += c.Skipped
	default:
		return nil, fmt.Errorf("cluster: unknown schedule op %q", c.Op)
	}
	return s.with(index, func(m map[string]*Schedule) { m[name] = &next }), nil
}

// ScheduleTaskID is the id of the task schedule slot's tick at tickMs
// enqueues: a sonyflake id with the tick's time (in 10 ms units since
// crdt.IDEpoch), and the slot in the sequence and machine bits, with a
// machine id of 0 to 7, which no node issues (their machine ids are 8
// and up: node.idGen). Two leaders enqueuing one tick make one id.
func ScheduleTaskID(slot uint16, tickMs int64) uint64 {
	units := uint64(max(tickMs-crdt.IDEpoch.UnixMilli(), 10) / 10)
	seq, machine := uint64(slot>>3), uint64(slot&7)
	return units<<24 | seq<<16 | machine
}
