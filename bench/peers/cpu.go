package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pidList is a flag of comma-separated process ids.
type pidList []int

func (p *pidList) String() string {
	s := make([]string, len(*p))
	for i, v := range *p {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (p *pidList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return fmt.Errorf("bad pid %q", f)
		}
		*p = append(*p, n)
	}
	return nil
}

// cpuMeter measures the CPU time of the server processes around the timed
// part of a run. Before it, it waits for the servers to be idle (so that
// the work of a claim run's preload, replication to the last replica
// included, is not counted); after it, it waits for them to be idle again
// and counts that tail too: work the tasks caused after their last answer
// (the last replica catching up, deletions) is theirs.
//
// "Idle" is relative to the servers' idle rate (idleCores, measured by the
// idle subcommand after the cluster started): a server may use a steady
// share of a core with no requests (a Norn cluster does), which the
// measure includes like any other CPU time; NetPerTaskUS leaves it out.
type cpuMeter struct {
	pids       pidList
	clkTck     int
	idleCores  float64
	quietCores float64
	settleMax  time.Duration

	start, window          int64 // ticks
	settledBefore          time.Duration
	windowStart, windowEnd time.Time
}

// CPUStats is the servers' CPU time over one run, every process summed.
type CPUStats struct {
	Processes int `json:"processes"`
	// WindowUS is the CPU time from the start of the timed part to its end.
	WindowUS float64 `json:"window_us"`
	// TotalUS adds the tail: until the servers were idle again (or
	// settle-max passed).
	TotalUS   float64 `json:"total_us"`
	WindowS   float64 `json:"window_s"`
	TailS     float64 `json:"tail_s"`
	PerTaskUS float64 `json:"per_task_us"` // TotalUS / completed tasks
	// IdleCores is the servers' idle rate given with -idle-cores;
	// NetPerTaskUS is PerTaskUS without it (over WindowS + TailS).
	IdleCores    float64 `json:"idle_cores"`
	NetPerTaskUS float64 `json:"net_per_task_us"`
	// SettleBeforeS is how long the servers took to become idle before the
	// timed part; SettledAfter is false if they were still busy at the end
	// of the tail (settle-max).
	SettleBeforeS float64 `json:"settle_before_s"`
	SettledAfter  bool    `json:"settled_after"`
}

func (m *cpuMeter) on() bool { return len(m.pids) > 0 }

// ticks returns utime+stime of every process, summed, in clock ticks.
func (m *cpuMeter) ticks() (int64, error) {
	var sum int64
	for _, pid := range m.pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, fmt.Errorf("server process %d: %w", pid, err)
		}
		// The command name (field 2) is in parentheses and may hold
		// spaces: the fields after it start at the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			return 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
		}
		// f[0] is field 3 (state); utime and stime are fields 14 and 15.
		for _, v := range f[11:13] {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
			}
			sum += n
		}
	}
	return sum, nil
}

// settle waits until the servers use at most quietCores above their idle
// rate over a 500 ms interval, at most settleMax; it reports whether they
// did.
func (m *cpuMeter) settle() (bool, error) {
	const step = 500 * time.Millisecond
	quiet := (m.idleCores + m.quietCores) * step.Seconds() * float64(m.clkTck)
	deadline := time.Now().Add(m.settleMax)
	prev, err := m.ticks()
	if err != nil {
		return false, err
	}
	for time.Now().Before(deadline) {
		time.Sleep(step)
		cur, err := m.ticks()
		if err != nil {
			return false, err
		}
		if float64(cur-prev) <= quiet {
			return true, nil
		}
		prev = cur
	}
	return false, nil
}

// begin is called right before the timed part starts.
func (m *cpuMeter) begin() error {
	if !m.on() {
		return nil
	}
	t := time.Now()
	if _, err := m.settle(); err != nil {
		return err
	}
	m.settledBefore = time.Since(t)
	var err error
	m.start, err = m.ticks()
	m.windowStart = time.Now()
	return err
}

// endWindow is called as soon as the timed part ends.
func (m *cpuMeter) endWindow() error {
	if !m.on() {
		return nil
	}
	t, err := m.ticks()
	m.window, m.windowEnd = t-m.start, time.Now()
	return err
}

// finish waits for the tail and records the measure in res.
func (m *cpuMeter) finish(res *Result) error {
	if !m.on() {
		return nil
	}
	settled, err := m.settle()
	if err != nil {
		return err
	}
	t, err := m.ticks()
	if err != nil {
		return err
	}
	now := time.Now()
	us := func(ticks int64) float64 { return math.Round(float64(ticks) * 1e6 / float64(m.clkTck)) }
	round2 := func(x float64) float64 { return math.Round(x*100) / 100 }
	st := &CPUStats{
		Processes:     len(m.pids),
		WindowUS:      us(m.window),
		TotalUS:       us(t - m.start),
		WindowS:       round2(m.windowEnd.Sub(m.windowStart).Seconds()),
		TailS:         round2(now.Sub(m.windowEnd).Seconds()),
		IdleCores:     m.idleCores,
		SettleBeforeS: round2(m.settledBefore.Seconds()),
		SettledAfter:  settled,
	}
	if res.Completed > 0 {
		idle := m.idleCores * now.Sub(m.windowStart).Seconds() * 1e6
		st.PerTaskUS = math.Round(st.TotalUS/float64(res.Completed)*10) / 10
		st.NetPerTaskUS = math.Round((st.TotalUS-idle)/float64(res.Completed)*10) / 10
	}
	res.ServerCPU = st
	return nil
}

// idleMain prints the servers' idle CPU rate in cores: the median of three
// one-second samples, taken after a second's pause.
func idleMain(fs *flag.FlagSet, args []string) error {
	var m cpuMeter
	fs.Var(&m.pids, "server-pids", "comma-separated pids of the server processes")
	fs.IntVar(&m.clkTck, "clk-tck", 100, "clock ticks per second of /proc/<pid>/stat (getconf CLK_TCK)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !m.on() {
		return fmt.Errorf("no -server-pids")
	}
	time.Sleep(time.Second)
	var rates []float64
	prev, err := m.ticks()
	if err != nil {
		return err
	}
	for range 3 {
		time.Sleep(time.Second)
		cur, err := m.ticks()
		if err != nil {
			return err
		}
		rates = append(rates, float64(cur-prev)/float64(m.clkTck))
		prev = cur
	}
	slices.Sort(rates)
	fmt.Printf("%.2f\n", rates[1])
	return nil
}
