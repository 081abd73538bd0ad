package cluster

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/norn-dev/norn/crdt"
)

func TestMetaSchedules(t *testing.T) {
	l := startLeader(t)
	propose(t, l.meta, firstRing(t))
	cmd := func(c ScheduleCommand) (uint64, error) { return l.meta.ProposeSchedule(&c, proposeTimeout) }
	def := func(name string) *ScheduleDef {
		return &ScheduleDef{Name: name, IntervalMs: 1000, Template: []byte{1, 2}}
	}
	if _, err := cmd(ScheduleCommand{Op: ScheduleCreate, Def: def("a"), NowMs: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := cmd(ScheduleCommand{Op: ScheduleCreate, Def: def("b"), NowMs: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := cmd(ScheduleCommand{Op: ScheduleCreate, Def: def("a")}); !errors.Is(err, ErrScheduleExists) {
		t.Fatalf("a second create of a: %v", err)
	}
	s := l.meta.Schedules()
	if a, b := s.Get("a"), s.Get("b"); a.Slot != 0 || b.Slot != 1 || a.CreatedMs != 7 || strings.Join(s.Names(), ",") != "a,b" {
		t.Fatalf("table %+v", s)
	}
	// A deleted schedule's slot goes to the next one.
	if _, err := cmd(ScheduleCommand{Op: ScheduleDelete, Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cmd(ScheduleCommand{Op: ScheduleDelete, Name: "a"}); err != nil {
		t.Fatalf("delete of a schedule gone: %v", err)
	}
	if _, err := cmd(ScheduleCommand{Op: ScheduleCreate, Def: def("c")}); err != nil {
		t.Fatal(err)
	}
	if c := l.meta.Schedules().Get("c"); c.Slot != 0 {
		t.Fatalf("c has slot %d, want the freed 0", c.Slot)
	}
	// Ran moves forward only.
	if _, err := cmd(ScheduleCommand{Op: ScheduleRan, Name: "b", TickMs: 5000, TaskID: 9, Skipped: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := cmd(ScheduleCommand{Op: ScheduleRan, Name: "b", TickMs: 4000, TaskID: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := cmd(ScheduleCommand{Op: ScheduleRan, Name: "b", TickMs: 6000, Skipped: 1}); err != nil {
		t.Fatal(err)
	}
	if b := l.meta.Schedules().Get("b"); b.LastTickMs != 6000 || b.LastTaskID != 9 || b.Skipped != 3 {
		t.Fatalf("b after its ticks: %+v", b)
	}
	// Pause and update keep the state.
	if _, err := cmd(ScheduleCommand{Op: SchedulePause, Name: "b", Paused: true}); err != nil {
		t.Fatal(err)
	}
	upd := def("b")
	upd.Cron, upd.IntervalMs = "@hourly", 0
	if _, err := cmd(ScheduleCommand{Op: ScheduleUpdate, Def: upd}); err != nil {
		t.Fatal(err)
	}
	if b := l.meta.Schedules().Get("b"); b.Paused || b.Cron != "@hourly" || b.LastTickMs != 6000 || b.Slot != 1 {
		t.Fatalf("b after pause and update: %+v (an update replaces the definition, paused included)", b)
	}
	for _, bad := range []ScheduleCommand{
		{Op: ScheduleUpdate, Def: def("zz")},
		{Op: SchedulePause, Name: "zz"},
		{Op: ScheduleRan, Name: "zz", TickMs: 1},
		{Op: ScheduleCreate, Def: def("bad name")},
		{Op: "frobnicate", Name: "b"},
	} {
		if _, err := cmd(bad); err == nil {
			t.Errorf("%+v was taken", bad)
		}
	}

	// The snapshot carries the table (format 3); a table-less group
	// writes format 2 or the bare ring, as before.
	snap := persist(t, l.meta.fsm)
	if !strings.Contains(snap, `"meta_snapshot_format":3`) {
		t.Fatalf("snapshot: %s", snap)
	}
	f := &metaFSM{}
	if err := f.Restore(io.NopCloser(strings.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.schedules, l.meta.Schedules()) {
		t.Fatalf("restored %+v, want %+v", f.schedules, l.meta.Schedules())
	}
	if s := persist(t, &metaFSM{ring: firstRing(t), queues: &Queues{}}); !strings.Contains(s, `"meta_snapshot_format":2`) || strings.Contains(s, "schedules") {
		t.Fatalf("a snapshot without schedules: %s", s)
	}
	// A table whose slots collide is refused.
	broken := strings.Replace(snap, `"slot":1`, `"slot":0`, 1)
	if err := (&metaFSM{}).Restore(io.NopCloser(strings.NewReader(broken))); err == nil {
		t.Fatal("a table with two schedules in one slot was restored")
	}
}

// Two slots never make one id, one slot's ticks 10 ms apart never do,
// and the ids carry the tick's time and a machine id no node issues.
func TestScheduleTaskID(t *testing.T) {
	tick := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC).UnixMilli()
	seen := map[uint64]bool{}
	for _, slot := range []uint16{0, 1, 7, 8, 255, 256, MaxSchedules - 1} {
		for _, dt := range []int64{0, 10, 1000} {
			id := ScheduleTaskID(slot, tick+dt)
			if seen[id] {
				t.Fatalf("slot %d tick +%d ms: id %d made twice", slot, dt, id)
			}
			seen[id] = true
			if got := crdt.IDTime(id); !got.Equal(time.UnixMilli(tick + dt)) {
				t.Fatalf("id %d reads %v, want the tick %v", id, got, time.UnixMilli(tick+dt))
			}
			if machine := id & 0xffff; machine >= 8 {
				t.Fatalf("slot %d: machine id %d, which nodes issue", slot, machine)
			}
		}
	}
}
