package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
)

// tableMain prints the medians over the runs of every workload, NATS next
// to Norn, as a markdown table.
func tableMain(fs *flag.FlagSet, args []string) error {
	in := fs.String("in", "", "JSON lines written by the runs")
	nats := fs.String("nats", "nats-r3", "the NATS rows' -system")
	norn := fs.String("norn", "norn-3", "the Norn rows' -system")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	type key struct{ workload, mode string }
	var keys []key
	rows := map[key]map[string][]*Result{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		r := &Result{}
		if err := json.Unmarshal([]byte(line), r); err != nil {
			return fmt.Errorf("bad line %q: %w", line, err)
		}
		k := key{r.Workload, "-"}
		if r.Workload == "claim" {
			k.mode = fmt.Sprintf("%v in flight per worker", r.Params["pipeline"])
		}
		if rows[k] == nil {
			rows[k] = map[string][]*Result{}
			keys = append(keys, k)
		}
		rows[k][r.System] = append(rows[k][r.System], r)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	med := func(rs []*Result, f func(*Result) (float64, bool)) float64 {
		var v []float64
		for _, r := range rs {
			if x, ok := f(r); ok {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			return math.NaN()
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	rate := func(r *Result) (float64, bool) { return r.TasksPerSec, true }
	cpu := func(r *Result) (float64, bool) {
		if r.ServerCPU == nil {
			return 0, false
		}
		return r.ServerCPU.PerTaskUS, true
	}
	fmt.Println("| workload | mode | NATS R3 always tasks/s | Norn W=2 tasks/s | Norn/NATS | NATS p99 ms | Norn p99 ms | NATS CPU us/task | Norn CPU us/task | Norn/NATS CPU |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, k := range keys {
		lat := "complete"
		if k.workload == "enqueue" {
			lat = "ack"
		}
		p99 := func(r *Result) (float64, bool) {
			s, ok := r.Lat[lat]
			return s.P99US / 1000, ok
		}
		a, b := rows[k][*nats], rows[k][*norn]
		n, m := med(a, rate), med(b, rate)
		nc, mc := med(a, cpu), med(b, cpu)
		fmt.Printf("| %s | %s | %s | %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.2f |\n",
			k.workload, k.mode, thousands(n), thousands(m), m/n, med(a, p99), med(b, p99), nc, mc, mc/nc)
	}
	all := map[string][]*Result{}
	for _, k := range keys {
		for sys, rs := range rows[k] {
			all[sys] = append(all[sys], rs...)
		}
	}
	idle := func(r *Result) (float64, bool) {
		if r.ServerCPU == nil {
			return 0, false
		}
		return r.ServerCPU.IdleCores, true
	}
	fmt.Printf("\nThe servers' CPU with no requests (3 processes together, median): NATS %.2f cores, Norn %.2f cores;\n"+
		"the CPU columns include it (the JSON lines' net_per_task_us leave it out).\n", med(all[*nats], idle), med(all[*norn], idle))
	return nil
}

// thousands formats x rounded, with commas between thousands.
func thousands(x float64) string {
	if math.IsNaN(x) {
		return "NaN"
	}
	s := fmt.Sprintf("%.0f", x)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}
