package ring

import (
	"fmt"
	"math/big"
)

// Ideal loads.
//
// A node's ideal load is its weight's share of the P*N replicas, subject to
// two caps: a node holds at most one replica per partition (at most P), and
// a zone holds at most perZone replicas per partition (at most perZone*P).
// Load above a cap goes to the uncapped nodes in proportion to their
// weights (water-filling): with rate λ, an uncapped node gets λ*weight, a
// node-capped one P, and the nodes of a capped zone share its perZone*P as
// min(P, μ*weight) with the zone's own, smaller, rate μ. All arithmetic is
// exact (math/big), so equal inputs give equal roundings on every machine.

// idealLoads returns each node's ideal load (see above). zone[i] is node i's
// zone index in [0, zones); weights are positive.
func idealLoads(weights []int64, zone []int, zones int, p, n, perZone int) []*big.Rat {
	ideal := make([]*big.Rat, len(weights))
	active := make([]bool, len(weights))
	for i := range active {
		active[i] = true
	}
	nodeCap := big.NewRat(int64(p), 1)
	zoneCap := new(big.Rat).SetInt64(int64(perZone) * int64(p))
	zoneFixed := make([]*big.Rat, zones)
	for z := range zoneFixed {
		zoneFixed[z] = new(big.Rat)
	}
	remaining := new(big.Rat).SetInt64(int64(p) * int64(n))

	for {
		w := new(big.Rat)
		for i, a := range active {
			if a {
				w.Add(w, big.NewRat(weights[i], 1))
			}
		}
		if w.Sign() == 0 {
			break
		}
		rate := new(big.Rat).Quo(remaining, w)

		// Zones whose demand at this rate (node caps applied) exceeds the
		// zone cap are saturated: they get exactly the cap.
		saturated := false
		for z := range zones {
			var members []int
			demand := new(big.Rat).Set(zoneFixed[z])
			for i, a := range active {
				if a && zone[i] == z {
					members = append(members, i)
					demand.Add(demand, minRat(nodeCap, mulInt(rate, weights[i])))
				}
			}
			if len(members) == 0 || demand.Cmp(zoneCap) <= 0 {
				continue
			}
			rest := new(big.Rat).Sub(zoneCap, zoneFixed[z])
			ws := make([]int64, len(members))
			for j, i := range members {
				ws[j] = weights[i]
			}
			for j, x := range waterFill(rest, ws, nodeCap) {
				ideal[members[j]] = x
				active[members[j]] = false
			}
			remaining.Sub(remaining, rest)
			zoneFixed[z].Set(zoneCap)
			saturated = true
		}
		if saturated {
			continue
		}

		// Nodes whose share exceeds P are capped at P.
		capped := false
		for i, a := range active {
			if a && mulInt(rate, weights[i]).Cmp(nodeCap) > 0 {
				ideal[i] = new(big.Rat).Set(nodeCap)
				active[i] = false
				remaining.Sub(remaining, nodeCap)
				zoneFixed[zone[i]].Add(zoneFixed[zone[i]], nodeCap)
				capped = true
			}
		}
		if capped {
			continue
		}

		for i, a := range active {
			if a {
				ideal[i] = mulInt(rate, weights[i])
				active[i] = false
			}
		}
		remaining.SetInt64(0)
		break
	}
	if remaining.Sign() != 0 {
		// Plan checked N <= nodes and chose perZone so that the caps hold
		// at least P*N replicas.
		panic(fmt.Sprintf("ring: %s replicas left over after water-filling", remaining.RatString()))
	}
	return ideal
}

// waterFill shares total among nodes of the given weights as min(cap, μ*w).
// The caller guarantees total <= cap*len(weights).
func waterFill(total *big.Rat, weights []int64, cap *big.Rat) []*big.Rat {
	out := make([]*big.Rat, len(weights))
	remaining := new(big.Rat).Set(total)
	for {
		w := new(big.Rat)
		for i, x := range out {
			if x == nil {
				w.Add(w, big.NewRat(weights[i], 1))
			}
		}
		if w.Sign() == 0 {
			return out
		}
		rate := new(big.Rat).Quo(remaining, w)
		capped := false
		for i, x := range out {
			if x == nil && mulInt(rate, weights[i]).Cmp(cap) > 0 {
				out[i] = new(big.Rat).Set(cap)
				remaining.Sub(remaining, cap)
				capped = true
			}
		}
		if capped {
			continue
		}
		for i, x := range out {
			if x == nil {
				out[i] = mulInt(rate, weights[i])
			}
		}
		return out
	}
}

// fixedScale is the scale of the fixed-point ideal loads the planner's
// heuristics compare (exact comparisons use big.Rat).
const fixedScale = 1 << 20

// toFixed returns floor(x * fixedScale).
func toFixed(x *big.Rat) int64 {
	y := new(big.Rat).Mul(x, big.NewRat(fixedScale, 1))
	return new(big.Int).Quo(y.Num(), y.Denom()).Int64()
}

// floorCeil returns the floor and the ceiling of x >= 0.
func floorCeil(x *big.Rat) (lo, hi int) {
	lo = int(new(big.Int).Quo(x.Num(), x.Denom()).Int64()) // x >= 0: truncation is floor
	if x.IsInt() {
		return lo, lo
	}
	return lo, lo + 1
}

func mulInt(r *big.Rat, k int64) *big.Rat {
	return new(big.Rat).Mul(r, big.NewRat(k, 1))
}

func minRat(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
		return a
	}
	return b
}
