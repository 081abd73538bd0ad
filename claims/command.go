package claims

// The binary encoding of a Command: a Raft log entry's data.

import (
	"encoding/binary"
)

// Encoding of a command: version, op, then the op's fields. Version 2
// adds a retry policy to each claim candidate and act; a command that uses
// no retry is written as version 1, which a node from before retries can
// apply. Version 3 adds a deadline to each claim candidate, and
// OpDeadline; only a command that uses deadlines is written so. A node that cannot decode version 2 stops on it (rather than
// skip it), so a cluster that mixes versions fails loudly, not silently
// (docs/OPERATIONS.md, upgrades).
const (
	commandVersion   = 1
	commandVersionV2 = 2
	commandVersionV3 = 3
)

// usesDeadlines reports whether cmd needs the version 3 encoding.
func (cmd *Command) usesDeadlines() bool {
	for _, c := range cmd.Candidates {
		if c.DeadlineMs != 0 {
			return true
		}
	}
	return cmd.Op == OpDeadline
}

// usesRetry reports whether cmd needs the version 2 encoding.
func (cmd *Command) usesRetry() bool {
	for _, c := range cmd.Candidates {
		if c.Retry != nil {
			return true
		}
	}
	for _, a := range cmd.Acts {
		if a.Retry != nil || a.End == EndFailed {
			return true
		}
	}
	for _, e := range cmd.Ends {
		if e.Life != 0 {
			return true
		}
	}
	return cmd.Op == OpRevive
}

// Encode returns cmd's binary encoding (the Raft log entry's data).
func (cmd *Command) Encode() []byte {
	v3 := cmd.usesDeadlines()
	v2 := v3 || cmd.usesRetry()
	b := []byte{commandVersion, byte(cmd.Op)}
	switch {
	case v3:
		b[0] = commandVersionV3
	case v2:
		b[0] = commandVersionV2
	}
	b = binary.AppendVarint(b, cmd.NowMs)
	switch cmd.Op {
	case OpClaim:
		b = appendString(b, cmd.Worker)
		b = binary.AppendVarint(b, cmd.LeaseMs)
		b = binary.AppendUvarint(b, uint64(len(cmd.Candidates)))
		for _, c := range cmd.Candidates {
			b = binary.AppendUvarint(b, c.ID)
			b = binary.AppendVarint(b, c.NotBeforeMs)
			b = binary.AppendUvarint(b, uint64(c.MaxClaims))
			if v2 {
				b = appendPolicy(b, c.Retry)
			}
			if v3 {
				b = binary.AppendVarint(b, c.DeadlineMs)
			}
		}
	case OpRenew:
		b = binary.AppendUvarint(b, cmd.ID)
		b = binary.AppendUvarint(b, cmd.Token)
		b = binary.AppendVarint(b, cmd.LeaseMs)
	case OpYield:
		b = binary.AppendUvarint(b, cmd.ID)
		b = binary.AppendUvarint(b, cmd.Token)
	case OpEnd:
		b = binary.AppendUvarint(b, uint64(len(cmd.Ends)))
		for _, e := range cmd.Ends {
			b = binary.AppendUvarint(b, e.ID)
			b = binary.AppendUvarint(b, e.Token)
			b = append(b, byte(e.Reason))
			if v2 {
				b = binary.AppendUvarint(b, uint64(e.Life))
			}
		}
	case OpExpire:
		b = binary.AppendUvarint(b, cmd.ID)
		b = binary.AppendUvarint(b, cmd.Token)
		b = binary.AppendVarint(b, cmd.SkewMs)
	case OpExtend:
		b = binary.AppendVarint(b, cmd.MinExpiryMs)
		b = appendIDs(b, cmd.IDs)
	case OpForget:
		b = appendIDs(b, cmd.IDs)
	case OpRevive:
		b = binary.AppendUvarint(b, cmd.ID)
		b = binary.AppendUvarint(b, uint64(cmd.Life))
	case OpDeadline:
		b = binary.AppendUvarint(b, uint64(len(cmd.Deadlines)))
		for _, dl := range cmd.Deadlines {
			b = binary.AppendUvarint(b, dl.ID)
			b = binary.AppendUvarint(b, uint64(dl.Life))
			b = binary.AppendVarint(b, dl.DeadlineMs)
			b = appendBytes(b, dl.State)
		}
	case OpUnique:
		b = appendUniques(b, cmd.Uniques)
	case OpAct:
		b = binary.AppendUvarint(b, uint64(len(cmd.Acts)))
		for _, act := range cmd.Acts {
			b = binary.AppendUvarint(b, act.ID)
			b = binary.AppendUvarint(b, act.Token)
			b = append(b, byte(act.End))
			b = appendBytes(b, act.State)
			if v2 {
				b = appendPolicy(b, act.Retry)
			}
		}
	}
	return b
}

// appendBytes appends v with its length; nil and empty encode alike and
// decode as nil.
func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// DecodeCommand parses a command. It never panics; malformed input gives an
// error wrapping ErrCorrupt.
func DecodeCommand(b []byte) (*Command, error) {
	d := decoder{buf: b}
	v := d.byte()
	if d.err == nil && (v < commandVersion || v > commandVersionV3) {
		d.fail("command version %d", v)
	}
	v2, v3 := v >= commandVersionV2, v == commandVersionV3
	cmd := &Command{Op: Op(d.byte()), NowMs: d.varint()}
	switch cmd.Op {
	case OpClaim:
		cmd.Worker, cmd.LeaseMs = d.string(), d.varint()
		if n := d.count(3); n > 0 {
			cmd.Candidates = make([]Candidate, n)
			for i := range cmd.Candidates {
				cmd.Candidates[i] = Candidate{ID: d.uvarint(), NotBeforeMs: d.varint(), MaxClaims: d.uint32()}
				if v2 {
					cmd.Candidates[i].Retry = d.policy()
				}
				if v3 {
					cmd.Candidates[i].DeadlineMs = d.varint()
				}
			}
		}
	case OpRenew:
		cmd.ID, cmd.Token, cmd.LeaseMs = d.uvarint(), d.uvarint(), d.varint()
	case OpYield:
		cmd.ID, cmd.Token = d.uvarint(), d.uvarint()
	case OpEnd:
		if n := d.count(3); n > 0 {
			cmd.Ends = make([]End, n)
			for i := range cmd.Ends {
				cmd.Ends[i] = End{ID: d.uvarint(), Token: d.uvarint(), Reason: EndReason(d.byte())}
				if v2 {
					cmd.Ends[i].Life = d.uint32()
				}
			}
		}
	case OpExpire:
		cmd.ID, cmd.Token, cmd.SkewMs = d.uvarint(), d.uvarint(), d.varint()
	case OpExtend:
		cmd.MinExpiryMs = d.varint()
		cmd.IDs = d.ids()
	case OpForget:
		cmd.IDs = d.ids()
	case OpRevive:
		if !v2 {
			d.fail("revive in a version 1 command")
		}
		cmd.ID, cmd.Life = d.uvarint(), d.uint32()
	case OpDeadline:
		if !v3 {
			d.fail("deadline in a version %d command", v)
		}
		if n := d.count(4); n > 0 {
			cmd.Deadlines = make([]Deadline, n)
			for i := range cmd.Deadlines {
				cmd.Deadlines[i] = Deadline{ID: d.uvarint(), Life: d.uint32(), DeadlineMs: d.varint(), State: d.bytes()}
			}
		}
	case OpUnique:
		cmd.Uniques = d.uniques()
	case OpAct:
		if n := d.count(4); n > 0 {
			cmd.Acts = make([]Act, n)
			for i := range cmd.Acts {
				cmd.Acts[i] = Act{ID: d.uvarint(), Token: d.uvarint(), End: EndReason(d.byte()), State: d.bytes()}
				if v2 {
					cmd.Acts[i].Retry = d.policy()
				}
			}
		}
	default:
		d.fail("unknown op %d", cmd.Op)
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return cmd, nil
}

func appendIDs(b []byte, ids []uint64) []byte {
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
	}
	return b
}

func (d *decoder) ids() []uint64 {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = d.uvarint()
	}
	return ids
}
