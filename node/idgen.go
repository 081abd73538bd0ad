package node

import (
	"fmt"
	"sync/atomic"

	"github.com/sony/sonyflake"

	"github.com/norn-dev/norn/crdt"
)

// idGenerators is how many sonyflake generators a node runs. One generator
// issues at most 256 ids per 10 ms (25,600/s) and sleeps when asked for
// more; several, with consecutive machine ids, lift that ceiling.
const idGenerators = 8

// idGen hands out task ids from a few sonyflake generators in turn.
type idGen struct {
	gens []*sonyflake.Sonyflake
	next atomic.Uint64
}

func newIDGen(machineBase uint16) (*idGen, error) {
	g := &idGen{}
	for i := range uint16(idGenerators) {
		mid := machineBase*idGenerators + i
		sf, err := sonyflake.New(sonyflake.Settings{
			StartTime: crdt.IDEpoch,
			MachineID: func() (uint16, error) { return mid, nil },
		})
		if err != nil {
			return nil, fmt.Errorf("node: id generator: %w", err)
		}
		g.gens = append(g.gens, sf)
	}
	return g, nil
}

// NextID returns a new, never-zero task id.
func (g *idGen) NextID() (uint64, error) {
	sf := g.gens[g.next.Add(1)%uint64(len(g.gens))]
	return sf.NextID()
}
