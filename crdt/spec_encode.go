package crdt

import (
	"encoding/binary"
	"math"
)

// The encoding of a task's spec (see encode.go for the whole task's).

func appendSpec(dst []byte, s *Spec) []byte {
	dst = appendString(dst, s.Queue)
	dst = binary.AppendVarint(dst, int64(s.Priority))
	dst = appendBytes(dst, s.Payload)
	dst = binary.AppendVarint(dst, s.NotBeforeMs)
	dst = binary.AppendUvarint(dst, uint64(len(s.DependsOn)))
	for _, d := range s.DependsOn {
		dst = binary.AppendUvarint(dst, d)
	}
	dst = binary.AppendUvarint(dst, uint64(s.MaxClaims))
	dst = appendTimestamp(dst, s.CreatedAt)
	if p := s.Retry; p != nil {
		dst = binary.AppendUvarint(dst, uint64(p.MaxAttempts))
		dst = binary.AppendVarint(dst, p.InitialMs)
		dst = binary.AppendVarint(dst, p.MaxMs)
		dst = binary.AppendUvarint(dst, uint64(p.MultiplierMilli))
		dst = binary.AppendUvarint(dst, uint64(p.JitterMilli))
	}
	if s.DeadlineMs != 0 {
		dst = binary.AppendVarint(dst, s.DeadlineMs)
	}
	if s.UniqueKey != "" {
		dst = appendString(dst, s.UniqueKey)
		dst = binary.AppendVarint(dst, s.UniqueForMs)
	}
	if s.FairnessKey != "" {
		dst = appendString(dst, s.FairnessKey)
		dst = binary.AppendUvarint(dst, uint64(s.FairnessWeight))
	}
	return dst
}

// specParts says which optional parts a spec's encoding holds (the flags).
type specParts struct{ retry, deadline, unique, fairness bool }

// spec reads a spec; without payload it skips the payload instead of
// copying it.
func (r *reader) spec(payload bool, parts specParts) *Spec {
	s := &Spec{Queue: r.string()}
	p := r.varint()
	if p < math.MinInt32 || p > math.MaxInt32 {
		r.fail("priority %d overflows int32", p)
	}
	s.Priority = int32(p)
	if payload {
		s.Payload = r.bytes()
	} else {
		r.skip(r.count(1))
	}
	s.NotBeforeMs = r.varint()
	if n := r.count(1); n > 0 {
		s.DependsOn = make([]uint64, n)
		for i := range s.DependsOn {
			s.DependsOn[i] = r.uvarint()
		}
	}
	s.MaxClaims = r.uint32()
	s.CreatedAt = r.timestamp()
	if parts.retry {
		p := &RetryPolicy{MaxAttempts: r.uint32(), InitialMs: r.varint(), MaxMs: r.varint(),
			MultiplierMilli: r.uint32(), JitterMilli: r.uint32()}
		if r.err == nil {
			if err := p.Validate(); err != nil {
				r.fail("%v", err)
			}
		}
		s.Retry = p
	}
	if parts.deadline {
		if s.DeadlineMs = r.varint(); r.err == nil && s.DeadlineMs <= 0 {
			r.fail("deadline %d is not after 1970", s.DeadlineMs)
		}
	}
	if parts.unique {
		s.UniqueKey, s.UniqueForMs = r.string(), r.varint()
		if r.err == nil && (s.UniqueKey == "" || s.UniqueForMs < 0) {
			r.fail("unique key %q for %d ms", s.UniqueKey, s.UniqueForMs)
		}
	}
	if parts.fairness {
		s.FairnessKey, s.FairnessWeight = r.string(), r.uint32()
		if r.err == nil && (s.FairnessKey == "" || s.FairnessWeight > MaxFairnessWeight) {
			r.fail("fairness key %q of weight %d", s.FairnessKey, s.FairnessWeight)
		}
	}
	return s
}
