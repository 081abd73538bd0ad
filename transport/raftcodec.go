//lint:file-ignore SA1019 hashicorp/raft still fills and reads the legacy Leader and Candidate fields (a heartbeat is told by its Leader); a transport must carry them.

package transport

import (
	"encoding/binary"
	"time"

	"github.com/hashicorp/raft"
)

// The encodings of the Raft RPCs that travel as framed calls (MethodRaft).
// Integers are unsigned varints; byte slices are length-prefixed; bools
// are 0 or 1; a log entry's AppendedAt is Unix nanoseconds (0: unset).

// maxEntryBytes bounds a log entry's Data or Extensions in a call (the
// frame is bounded by maxRPCFrame anyway).
const maxEntryBytes = maxRPCFrame

// maxEntriesPerCall bounds the entries of one append (Raft sends at most
// MaxAppendEntries, 64 by default; the limit is hashicorp/raft's own
// ceiling of 1024).
const maxEntriesPerCall = 1024

func encodeHeader(b []byte, h raft.RPCHeader) []byte {
	b = binary.AppendUvarint(b, uint64(h.ProtocolVersion))
	b = appendBytes(b, h.ID)
	return appendBytes(b, h.Addr)
}

func decodeHeader(r *frameReader) raft.RPCHeader {
	var h raft.RPCHeader
	h.ProtocolVersion = raft.ProtocolVersion(r.uvarint())
	h.ID = r.bytes()
	h.Addr = r.bytes()
	return h
}

func (r *frameReader) bool() bool { return r.uvarint() == 1 }

func appendBool(b []byte, v bool) []byte { return binary.AppendUvarint(b, boolByte(v)) }

func encodeAppend(a *raft.AppendEntriesRequest) []byte {
	b := encodeHeader(nil, a.RPCHeader)
	b = binary.AppendUvarint(b, a.Term)
	b = appendBytes(b, a.Leader)
	b = binary.AppendUvarint(b, a.PrevLogEntry)
	b = binary.AppendUvarint(b, a.PrevLogTerm)
	b = binary.AppendUvarint(b, a.LeaderCommitIndex)
	b = binary.AppendUvarint(b, uint64(len(a.Entries)))
	for _, e := range a.Entries {
		b = binary.AppendUvarint(b, e.Index)
		b = binary.AppendUvarint(b, e.Term)
		b = binary.AppendUvarint(b, uint64(e.Type))
		b = appendBytes(b, e.Data)
		b = appendBytes(b, e.Extensions)
		var at uint64
		if !e.AppendedAt.IsZero() {
			at = uint64(e.AppendedAt.UnixNano())
		}
		b = binary.AppendUvarint(b, at)
	}
	return b
}

func decodeAppend(r *frameReader) *raft.AppendEntriesRequest {
	a := &raft.AppendEntriesRequest{RPCHeader: decodeHeader(r)}
	a.Term = r.uvarint()
	a.Leader = r.bytes()
	a.PrevLogEntry = r.uvarint()
	a.PrevLogTerm = r.uvarint()
	a.LeaderCommitIndex = r.uvarint()
	n := r.uvarint()
	if n > maxEntriesPerCall {
		r.fail("too many entries in an append")
		return a
	}
	for range n {
		e := &raft.Log{}
		e.Index = r.uvarint()
		e.Term = r.uvarint()
		e.Type = raft.LogType(r.uvarint())
		e.Data = r.bytesMax(maxEntryBytes)
		e.Extensions = r.bytesMax(maxEntryBytes)
		if at := r.uvarint(); at != 0 {
			e.AppendedAt = time.Unix(0, int64(at))
		}
		if r.err != nil {
			return a
		}
		a.Entries = append(a.Entries, e)
	}
	return a
}

func encodeAppendResp(a *raft.AppendEntriesResponse) []byte {
	b := encodeHeader(nil, a.RPCHeader)
	b = binary.AppendUvarint(b, a.Term)
	b = binary.AppendUvarint(b, a.LastLog)
	b = appendBool(b, a.Success)
	return appendBool(b, a.NoRetryBackoff)
}

func decodeAppendResp(r *frameReader, a *raft.AppendEntriesResponse) {
	*a = raft.AppendEntriesResponse{RPCHeader: decodeHeader(r)}
	a.Term = r.uvarint()
	a.LastLog = r.uvarint()
	a.Success = r.bool()
	a.NoRetryBackoff = r.bool()
}

func encodeVote(v *raft.RequestVoteRequest) []byte {
	b := encodeHeader(nil, v.RPCHeader)
	b = binary.AppendUvarint(b, v.Term)
	b = appendBytes(b, v.Candidate)
	b = binary.AppendUvarint(b, v.LastLogIndex)
	b = binary.AppendUvarint(b, v.LastLogTerm)
	return appendBool(b, v.LeadershipTransfer)
}

func decodeVote(r *frameReader) *raft.RequestVoteRequest {
	v := &raft.RequestVoteRequest{RPCHeader: decodeHeader(r)}
	v.Term = r.uvarint()
	v.Candidate = r.bytes()
	v.LastLogIndex = r.uvarint()
	v.LastLogTerm = r.uvarint()
	v.LeadershipTransfer = r.bool()
	return v
}

func encodeVoteResp(v *raft.RequestVoteResponse) []byte {
	b := encodeHeader(nil, v.RPCHeader)
	b = binary.AppendUvarint(b, v.Term)
	b = appendBytes(b, v.Peers)
	return appendBool(b, v.Granted)
}

func decodeVoteResp(r *frameReader, v *raft.RequestVoteResponse) {
	*v = raft.RequestVoteResponse{RPCHeader: decodeHeader(r)}
	v.Term = r.uvarint()
	v.Peers = r.bytes()
	v.Granted = r.bool()
}

func encodePreVote(v *raft.RequestPreVoteRequest) []byte {
	b := encodeHeader(nil, v.RPCHeader)
	b = binary.AppendUvarint(b, v.Term)
	b = binary.AppendUvarint(b, v.LastLogIndex)
	return binary.AppendUvarint(b, v.LastLogTerm)
}

func decodePreVote(r *frameReader) *raft.RequestPreVoteRequest {
	v := &raft.RequestPreVoteRequest{RPCHeader: decodeHeader(r)}
	v.Term = r.uvarint()
	v.LastLogIndex = r.uvarint()
	v.LastLogTerm = r.uvarint()
	return v
}

func encodePreVoteResp(v *raft.RequestPreVoteResponse) []byte {
	b := encodeHeader(nil, v.RPCHeader)
	b = binary.AppendUvarint(b, v.Term)
	return appendBool(b, v.Granted)
}

func decodePreVoteResp(r *frameReader, v *raft.RequestPreVoteResponse) {
	*v = raft.RequestPreVoteResponse{RPCHeader: decodeHeader(r)}
	v.Term = r.uvarint()
	v.Granted = r.bool()
}
