package ring

// A naive reference for the movement properties: can a placement keep a
// given set of replicas and still meet the rules? It is a max-flow problem
// with lower bounds, solved by Dinic's algorithm on the textbook reduction.

type flowEdge struct {
	to, rev int
	cap     int
}

type flowNet struct {
	adj   [][]flowEdge
	level []int
	iter  []int
}

func newFlowNet(n int) *flowNet { return &flowNet{adj: make([][]flowEdge, n)} }

func (f *flowNet) add(u, v, c int) {
	f.adj[u] = append(f.adj[u], flowEdge{v, len(f.adj[v]), c})
	f.adj[v] = append(f.adj[v], flowEdge{u, len(f.adj[u]) - 1, 0})
}

func (f *flowNet) bfs(s int) {
	f.level = make([]int, len(f.adj))
	for i := range f.level {
		f.level[i] = -1
	}
	f.level[s] = 0
	q := []int{s}
	for len(q) > 0 {
		u := q[0]
		q = q[1:]
		for _, e := range f.adj[u] {
			if e.cap > 0 && f.level[e.to] < 0 {
				f.level[e.to] = f.level[u] + 1
				q = append(q, e.to)
			}
		}
	}
}

func (f *flowNet) dfs(u, t, pushed int) int {
	if u == t {
		return pushed
	}
	for ; f.iter[u] < len(f.adj[u]); f.iter[u]++ {
		e := &f.adj[u][f.iter[u]]
		if e.cap > 0 && f.level[e.to] == f.level[u]+1 {
			if d := f.dfs(e.to, t, min(pushed, e.cap)); d > 0 {
				e.cap -= d
				f.adj[e.to][e.rev].cap += d
				return d
			}
		}
	}
	return 0
}

func (f *flowNet) maxFlow(s, t int) int {
	total := 0
	for {
		f.bfs(s)
		if f.level[t] < 0 {
			return total
		}
		f.iter = make([]int, len(f.adj))
		for {
			d := f.dfs(s, t, 1<<30)
			if d == 0 {
				break
			}
			total += d
		}
	}
}

// assignable reports whether each partition k can be given exactly need[k]
// more members out of cands[k] (node indexes, each usable once per
// partition), so that node i gets between lo[i] and hi[i] of them. With
// zoneOf and limit set, a partition may take at most room[k][zone] more
// members of one zone.
func assignable(need []int, cands [][]int, lo, hi []int, zoneOf []string, room []map[string]int) bool {
	nodes := len(lo)
	for i := range lo {
		if hi[i] < 0 {
			return false
		}
		lo[i] = max(lo[i], 0)
		if lo[i] > hi[i] {
			return false
		}
	}
	// Vertices: S, T, S', T', partitions, (partition, zone) groups, nodes.
	const S, T, S2, T2 = 0, 1, 2, 3
	next := 4
	partV := make([]int, len(need))
	for k := range need {
		partV[k] = next
		next++
	}
	nodeV := make([]int, nodes)
	for i := range nodeV {
		nodeV[i] = next
		next++
	}
	type group struct {
		k int
		z string
	}
	groupV := map[group]int{}
	var edges [][3]int
	demand := 0
	for k, cs := range cands {
		// S -> partition with lower = upper = need[k].
		edges = append(edges, [3]int{S2, partV[k], need[k]}, [3]int{S, T2, need[k]})
		demand += need[k]
		for _, i := range cs {
			from := partV[k]
			if room != nil {
				g := group{k, zoneOf[i]}
				v, ok := groupV[g]
				if !ok {
					v = next
					next++
					groupV[g] = v
					edges = append(edges, [3]int{partV[k], v, room[k][zoneOf[i]]})
				}
				from = v
			}
			edges = append(edges, [3]int{from, nodeV[i], 1})
		}
	}
	for i := range lo {
		edges = append(edges, [3]int{nodeV[i], T, hi[i] - lo[i]}, [3]int{nodeV[i], T2, lo[i]}, [3]int{S2, T, lo[i]})
		demand += lo[i]
	}
	edges = append(edges, [3]int{T, S, 1 << 30})
	f := newFlowNet(next)
	for _, e := range edges {
		f.add(e[0], e[1], e[2])
	}
	return f.maxFlow(S2, T2) == demand
}
