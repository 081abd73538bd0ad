//lint:file-ignore SA1019 hashicorp/raft still fills and reads the legacy Leader and Candidate fields (a heartbeat is told by its Leader); a transport must carry them.

package transport

// The wire format of the coalesced heartbeats (Heartbeats): their encoding
// and decoding, and the frame reader the group calls share.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

// maxHeartbeatsPerCall bounds the heartbeats of one call (a node leads at
// most 65,536 groups; the decoder refuses more than this).
const maxHeartbeatsPerCall = 4096

// The wire format, all integers unsigned varints, strings and byte
// slices length-prefixed (uvarint):
//
//	call:   count, then per heartbeat: group, term, protocol version,
//	        leader id, leader address, leader (the legacy field), previous
//	        log index and term, leader commit index (all 0 for a
//	        heartbeat; an empty append carries them)
//	answer: count, then per heartbeat: 0, protocol version, id, address,
//	        term, last log, success (0/1), no retry backoff (0/1)
//	                                   or: 1, error text

func appendBytes(b, s []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func encodeHeartbeats(calls []*hbCall) []byte {
	b := binary.AppendUvarint(nil, uint64(len(calls)))
	for _, c := range calls {
		r := c.req
		b = binary.AppendUvarint(b, uint64(c.group))
		b = binary.AppendUvarint(b, r.Term)
		b = binary.AppendUvarint(b, uint64(r.ProtocolVersion))
		b = appendBytes(b, r.ID)
		b = appendBytes(b, r.Addr)
		b = appendBytes(b, r.Leader)
		b = binary.AppendUvarint(b, r.PrevLogEntry)
		b = binary.AppendUvarint(b, r.PrevLogTerm)
		b = binary.AppendUvarint(b, r.LeaderCommitIndex)
	}
	return b
}

// frameReader decodes the wire format; the first error sticks.
type frameReader struct {
	b   []byte
	err error
}

// fail records a decoding error (the first one sticks).
func (r *frameReader) fail(msg string) {
	if r.err == nil {
		r.err = errors.New("transport: " + msg)
	}
}

func (r *frameReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("transport: truncated heartbeat frame")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *frameReader) bytes() []byte { return r.bytesMax(1 << 16) }

// bytesMax reads a length-prefixed byte slice of at most max bytes (a
// copy: nil when empty).
func (r *frameReader) bytesMax(max uint64) []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) || n > max {
		r.err = errors.New("transport: bad length in heartbeat frame")
		return nil
	}
	s := r.b[:n]
	r.b = r.b[n:]
	if n == 0 {
		return nil
	}
	return bytes.Clone(s)
}

type hbItem struct {
	group uint32
	req   *raft.AppendEntriesRequest
}

func decodeHeartbeats(body []byte) ([]hbItem, error) {
	r := &frameReader{b: body}
	n := r.uvarint()
	if n > maxHeartbeatsPerCall {
		return nil, fmt.Errorf("transport: %d heartbeats in one call, at most %d", n, maxHeartbeatsPerCall)
	}
	items := make([]hbItem, 0, n)
	for range n {
		g := r.uvarint()
		req := &raft.AppendEntriesRequest{}
		req.Term = r.uvarint()
		req.ProtocolVersion = raft.ProtocolVersion(r.uvarint())
		req.ID = r.bytes()
		req.Addr = r.bytes()
		req.Leader = r.bytes()
		req.PrevLogEntry = r.uvarint()
		req.PrevLogTerm = r.uvarint()
		req.LeaderCommitIndex = r.uvarint()
		if r.err != nil {
			return nil, r.err
		}
		if g > 0xFFFF_FFFF || req.Term == 0 {
			return nil, errors.New("transport: a heartbeat frame holds something other than a heartbeat or an empty append")
		}
		items = append(items, hbItem{group: uint32(g), req: req})
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = errors.New("transport: trailing bytes in heartbeat frame")
	}
	return items, r.err
}

func appendHeartbeatError(b []byte, msg string) []byte {
	return appendBytes(binary.AppendUvarint(b, 1), []byte(msg))
}

func boolByte(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func appendHeartbeatAnswer(b []byte, r *raft.AppendEntriesResponse) []byte {
	b = binary.AppendUvarint(b, 0)
	b = binary.AppendUvarint(b, uint64(r.ProtocolVersion))
	b = appendBytes(b, r.ID)
	b = appendBytes(b, r.Addr)
	b = binary.AppendUvarint(b, r.Term)
	b = binary.AppendUvarint(b, r.LastLog)
	b = binary.AppendUvarint(b, boolByte(r.Success))
	return binary.AppendUvarint(b, boolByte(r.NoRetryBackoff))
}

// decodeHeartbeatAnswers fills each call's response from an answer and
// returns each call's error.
func decodeHeartbeatAnswers(body []byte, calls []*hbCall) []error {
	errs := make([]error, len(calls))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	r := &frameReader{b: body}
	if n := r.uvarint(); r.err == nil && n != uint64(len(calls)) {
		return fail(fmt.Errorf("transport: %d heartbeat answers for %d heartbeats", n, len(calls)))
	}
	for i, c := range calls {
		switch r.uvarint() {
		case 0:
			var resp raft.AppendEntriesResponse
			resp.ProtocolVersion = raft.ProtocolVersion(r.uvarint())
			resp.ID = r.bytes()
			resp.Addr = r.bytes()
			resp.Term = r.uvarint()
			resp.LastLog = r.uvarint()
			resp.Success = r.uvarint() == 1
			resp.NoRetryBackoff = r.uvarint() == 1
			*c.resp = resp
		case 1:
			errs[i] = fmt.Errorf("transport: heartbeat of group %d: %s", c.group, r.bytes())
		default:
			if r.err == nil {
				r.err = errors.New("transport: bad heartbeat answer")
			}
		}
		if r.err != nil {
			return fail(r.err)
		}
	}
	return errs
}
