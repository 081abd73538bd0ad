package check

import "testing"

func TestSchedule(t *testing.T) {
	ticks := []int64{1000, 2000, 3000, 4000}
	one := []ScheduledTask{{1, 1000}, {2, 2000}, {3, 3000}, {4, 4000}}
	if v := Schedule(ticks, one, 0); !v.Valid || v.Counts["ticks"] != 4 {
		t.Fatalf("a task per tick: %+v", v)
	}
	if v := Schedule(ticks, one[:3], 1); !v.Valid || v.Counts["missing"] != 1 {
		t.Fatalf("a tick skipped, as the schedule says: %+v", v)
	}
	for _, c := range []struct {
		name, count string
		tasks       []ScheduledTask
		skipped     uint64
	}{
		{"a tick twice", "twice", append(one, ScheduledTask{5, 3000}), 0},
		{"a tick missing", "missing", one[:3], 0},
		{"a task at no tick", "stray", append(one, ScheduledTask{5, 3500}), 0},
	} {
		if v := Schedule(ticks, c.tasks, c.skipped); v.Valid || v.Counts[c.count] == 0 {
			t.Errorf("%s: %+v", c.name, v)
		}
	}
	if v := Schedule(nil, nil, 0); v.Skipped == "" {
		t.Fatalf("no ticks: %+v", v)
	}
}
