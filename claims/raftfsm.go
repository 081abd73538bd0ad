package claims

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/hashicorp/raft"
	"go.opentelemetry.io/otel/trace"

	"github.com/norn-dev/norn/storage"
	"github.com/norn-dev/norn/transport"
)

// KV is what the Raft FSM needs of the node's store (storage.Store
// implements it). Records are per partition.
type KV interface {
	// ClaimFSMRecordForApply returns the record of id, or an error
	// wrapping storage.ErrNotFound; the FSM does not modify it. Only the
	// partition's FSM calls it (it may cache what it reads).
	ClaimFSMRecordForApply(p uint16, id uint64) ([]byte, error)
	// ClaimFSMApplied returns the last applied Raft index, 0 when none.
	ClaimFSMApplied(p uint16) (uint64, error)
	// ApplyClaimFSM commits records, moves and applied index atomically.
	ApplyClaimFSM(p uint16, u storage.ClaimFSMUpdate, sync bool) error
	// SnapshotClaimFSM returns a consistent view of the FSM.
	SnapshotClaimFSM(p uint16) *storage.FSMSnapshot
	// ClaimFSMUnique returns the record of a unique key, or an error
	// wrapping storage.ErrNotFound.
	ClaimFSMUnique(p uint16, queue, key string) ([]byte, error)
	// RestoreClaimFSM replaces the FSM's state.
	RestoreClaimFSM(p uint16, applied uint64, records []storage.FSMRecord, live, delayed []storage.ClaimMark, uniques []storage.FSMUnique) error
	// Sync makes all committed writes durable.
	Sync() error
}

// Result is the response of one applied entry: the per-task outcomes, or
// Err when the entry could not be applied (a corrupt entry, a storage
// failure).
type Result struct {
	Outcomes []Outcome
	Err      error
}

// fsm is the raft.FSM (and raft.BatchingFSM) of one partition: it applies
// entries with Apply and commits each batch's effect to the store in one
// batch together with the applied index, skipping entries already applied
// (Raft replays the log after a restart, NoSnapshotRestoreOnStart).
type fsm struct {
	p      uint16
	kv     KV
	logger *slog.Logger
	bugs   Bugs // GroupConfig.Bugs
	tracer trace.Tracer

	// applied caches the stored applied index (valid when appliedKnown):
	// only this FSM writes it, from Raft's single FSM goroutine.
	applied      uint64
	appliedKnown bool

	// onEnded and onFatal are GroupConfig.OnEnded and OnFatal. failed is
	// the error that stopped this FSM (see stop): it applies nothing more.
	onEnded func(ids []uint64)
	onFatal func(error)
	failed  error

	// watches are the entries whose fate a Propose waits for, by index
	// (see watch); passed is the highest index this FSM has applied,
	// skipped or restored since it started.
	watchMu sync.Mutex
	watches map[uint64]entryWatch
	passed  uint64
}

// entryWatch waits for the entry of one index and term.
type entryWatch struct {
	term uint64
	ch   chan entryFate // buffered: the FSM never waits for the watcher
}

// entryFate is what became of a watched entry: applied, with its result;
// or known not to be (another entry took its index); or unknown (the FSM
// passed the index without applying it, by a snapshot or a replay).
type entryFate struct {
	applied bool
	res     *Result
	known   bool
}

// watch returns a channel that gets the fate of the entry of index idx
// and term once the FSM reaches idx; false when it has already.
func (f *fsm) watch(idx, term uint64) (<-chan entryFate, bool) {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	if idx <= f.passed {
		return nil, false
	}
	if f.watches == nil {
		f.watches = map[uint64]entryWatch{}
	}
	w := entryWatch{term: term, ch: make(chan entryFate, 1)}
	f.watches[idx] = w
	return w.ch, true
}

// unwatch drops the watch of idx that returned ch, if still there.
func (f *fsm) unwatch(idx uint64, ch <-chan entryFate) {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	if w, ok := f.watches[idx]; ok && (<-chan entryFate)(w.ch) == ch {
		delete(f.watches, idx)
	}
}

// settle tells the watches of the entries of a batch ApplyBatch is done
// with what became of them: an entry of the watched term is the watched
// entry (one index and term, one entry), applied when it has a result.
// (Raft hands the FSM commands only: Group.fate learns from the log that
// a watched index holds another kind of entry.)
func (f *fsm) settle(logs []*raft.Log, out []any) {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	for i, l := range logs {
		f.passed = max(f.passed, l.Index)
		w, ok := f.watches[l.Index]
		if !ok {
			continue
		}
		delete(f.watches, l.Index)
		res, _ := out[i].(*Result)
		switch {
		case l.Term != w.term:
			w.ch <- entryFate{known: true}
		case res != nil:
			w.ch <- entryFate{applied: true, res: res, known: true}
		default:
			w.ch <- entryFate{} // a replay: applied before, outcome unknown
		}
	}
}

// passTo tells the watches of indexes up to idx, which a snapshot
// covered, that their entries' fate is unknown.
func (f *fsm) passTo(idx uint64) {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	f.passed = max(f.passed, idx)
	for i, w := range f.watches {
		if i <= idx {
			delete(f.watches, i)
			w.ch <- entryFate{}
		}
	}
}

var _ raft.BatchingFSM = (*fsm)(nil)

// Apply applies one entry.
func (f *fsm) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies entries in order and commits their effects in one
// batch. Entries already applied (index <= the stored applied index) get a
// nil response. Then it settles the watches of the entries.
func (f *fsm) ApplyBatch(logs []*raft.Log) []any {
	out := f.applyBatch(logs)
	f.settle(logs, out)
	return out
}

func (f *fsm) applyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	if f.failed != nil {
		for i := range out {
			out[i] = &Result{Err: f.failed}
		}
		return out
	}
	applied, err := f.appliedIndex()
	if err != nil {
		f.stop(0, fmt.Errorf("claims: partition %d cannot read its applied index: %w", f.p, err), out)
		return out
	}
	overlay := map[uint64]*Record{}
	get := func(id uint64) (*Record, error) {
		if r, ok := overlay[id]; ok {
			return r, nil
		}
		b, err := f.kv.ClaimFSMRecordForApply(f.p, id)
		if errors.Is(err, storage.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return DecodeRecord(b)
	}
	uniques := newUniqueOverlay(f.kv, f.p)
	var u storage.ClaimFSMUpdate
	var order []uint64
	var results []*Result
	var ended []uint64       // tasks this batch made terminal
	var traced []tracedApply // the traced entries' apply spans, ended after the commit
	defer func() {
		for _, t := range traced {
			transport.EndSpan(t.span, t.res.Err)
		}
	}()
	var failed error // the entry that could not be applied: nothing from it on is
	for i, l := range logs {
		if l.Index <= applied {
			continue
		}
		if l.Type != raft.LogCommand {
			u.AppliedIndex = l.Index
			continue
		}
		res := &Result{}
		out[i] = res
		cmd, err := DecodeCommand(l.Data)
		if err != nil {
			failed = fmt.Errorf("claims: corrupt entry %d of partition %d: %w", l.Index, f.p, err)
			break
		}
		if span := f.startApply(l, cmd); span != nil {
			traced = append(traced, tracedApply{span, res})
		}
		var outcomes []Outcome
		var changes []Change
		var uchanges []UniqueChange
		if cmd.Op == OpUnique {
			outcomes, uchanges, err = ApplyUnique(cmd, uniques.get)
		} else {
			outcomes, changes, err = ApplyWithBugs(l.Index, cmd, get, f.bugs)
		}
		if err != nil {
			failed = fmt.Errorf("claims: entry %d of partition %d: %w", l.Index, f.p, err)
			break
		}
		uniques.note(uchanges)
		u.AppliedIndex = l.Index
		results = append(results, res)
		res.Outcomes = outcomes
		for _, c := range changes {
			if _, seen := overlay[c.ID]; !seen {
				order = append(order, c.ID)
			}
			overlay[c.ID] = c.Record
			switch {
			case c.Claimed:
				u.Moves = append(u.Moves, storage.IndexMove{ID: c.ID, Claimed: true, ExpiryMs: c.ExpiryMs})
			case c.Released:
				u.Moves = append(u.Moves, storage.IndexMove{ID: c.ID, DelayUntilMs: c.DelayUntilMs})
			}
			for _, m := range c.Merges {
				u.Merges = append(u.Merges, storage.FSMMerge{ID: c.ID, State: m})
			}
		}
		if cmd.Op == OpAct || cmd.Op == OpEnd || cmd.Op == OpExpire || cmd.Op == OpDeadline {
			for _, o := range outcomes {
				if o.Err == nil && !o.Repeated && o.Record != nil && (o.Record.Terminal != EndNone || o.Died != nil) {
					ended = append(ended, o.ID)
				}
			}
		}
	}
	if u.AppliedIndex != 0 {
		for _, id := range order {
			rec := storage.FSMRecord{ID: id} // nil Value deletes (OpForget)
			if r := overlay[id]; r != nil {
				rec.Value = r.Encode()
			}
			u.Records = append(u.Records, rec)
		}
		u.Uniques = uniques.changes()
		// Not synced: the entries are durable in the Raft log, and the
		// applied index in the same atomic batch tells a replay where to
		// resume.
		if err := f.kv.ApplyClaimFSM(f.p, u, false); err != nil {
			f.appliedKnown = false
			for _, r := range results {
				r.Outcomes = nil
			}
			f.stop(0, fmt.Errorf("claims: partition %d cannot store entries up to %d: %w", f.p, u.AppliedIndex, err), out)
			return out
		}
		f.applied = u.AppliedIndex
	}
	if failed != nil {
		// What came before the entry is stored: a restart replays from it.
		f.stop(f.applied, failed, out)
		return out
	}
	if len(ended) > 0 && f.onEnded != nil {
		f.onEnded(ended)
	}
	return out
}

// stop stops the FSM for good after err: an entry it could not read or
// apply, or a store it could not read or write. Going on would leave this
// replica without what the entry did (a claim it missed, an end) while
// Raft believes it applied: so every entry from here on fails with err
// (out's unset ones now), the stored applied index stays where the store
// last took it (stored, 0 when unknown), and OnFatal tells the node, which
// stops; a restart replays the log from the stored applied index.
func (f *fsm) stop(stored uint64, err error, out []any) {
	f.failed = fmt.Errorf("%w (this replica stopped applying; restart the node to replay from the last stored index)", err)
	for i := range out {
		if r, ok := out[i].(*Result); ok && r.Outcomes != nil {
			continue // applied and stored
		}
		out[i] = &Result{Err: f.failed}
	}
	f.logger.Error("claim FSM stopped: the node must stop; a restart replays from the last stored index",
		"partition", f.p, "stored_applied_index", stored, "err", err)
	if f.onFatal != nil {
		f.onFatal(f.failed)
	}
}

// appliedIndex returns the stored applied index, read once and then
// tracked.
func (f *fsm) appliedIndex() (uint64, error) {
	if !f.appliedKnown {
		a, err := f.kv.ClaimFSMApplied(f.p)
		if err != nil {
			return 0, err
		}
		f.applied, f.appliedKnown = a, true
	}
	return f.applied, nil
}

// Snapshot syncs the store (so the log may be truncated up to here) and
// takes a consistent view of the partition's FSM.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.kv.Sync(); err != nil {
		return nil, err
	}
	return &fsmSnapshot{snap: f.kv.SnapshotClaimFSM(f.p)}, nil
}

// Snapshot stream format: applied index (8 bytes), then per record its id
// (8 bytes), length (uvarint) and bytes; then, when the partition has
// unique key records, an id of 0 (no task has it) and per record its
// queue, key and record, each as a length (uvarint) and bytes; the stream
// ends at EOF.
type fsmSnapshot struct{ snap *storage.FSMSnapshot }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	w := bufio.NewWriter(sink)
	err := func() error {
		applied, err := s.snap.Applied()
		if err != nil {
			return err
		}
		if _, err := w.Write(binary.BigEndian.AppendUint64(nil, applied)); err != nil {
			return err
		}
		var hdr []byte
		err = s.snap.Records(func(id uint64, v []byte) error {
			hdr = binary.AppendUvarint(binary.BigEndian.AppendUint64(hdr[:0], id), uint64(len(v)))
			if _, err := w.Write(hdr); err != nil {
				return err
			}
			_, err := w.Write(v)
			return err
		})
		if err != nil {
			return err
		}
		if err := persistUniques(w, s.snap); err != nil {
			return err
		}
		return w.Flush()
	}()
	if err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() { s.snap.Close() }

// Restore replaces the partition's FSM with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	r := bufio.NewReader(rc)
	var buf [8]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return fmt.Errorf("claims: snapshot header: %w", err)
	}
	applied := binary.BigEndian.Uint64(buf[:])
	var recs []storage.FSMRecord
	var live, delayed []storage.ClaimMark
	var uniques []storage.FSMUnique
	for {
		if _, err := io.ReadFull(r, buf[:]); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("claims: snapshot record: %w", err)
		}
		id := binary.BigEndian.Uint64(buf[:])
		if id == 0 {
			var err error
			if uniques, err = restoreUniques(r); err != nil {
				return err
			}
			break
		}
		n, err := binary.ReadUvarint(r)
		if err != nil || n > 1<<24 {
			return fmt.Errorf("claims: snapshot record %d length: %v", id, err)
		}
		v := make([]byte, n)
		if _, err := io.ReadFull(r, v); err != nil {
			return fmt.Errorf("claims: snapshot record %d: %w", id, err)
		}
		rec, err := DecodeRecord(v)
		if err != nil {
			return fmt.Errorf("claims: snapshot record %d: %w", id, err)
		}
		recs = append(recs, storage.FSMRecord{ID: id, Value: v})
		if c, ok := rec.Live(); ok {
			live = append(live, storage.ClaimMark{ID: id, ExpiryMs: c.ExpiryMs})
		} else if rec.RetryAtMs != 0 && !rec.Done() {
			delayed = append(delayed, storage.ClaimMark{ID: id, ExpiryMs: rec.RetryAtMs})
		}
	}
	f.appliedKnown = false
	if err := f.kv.RestoreClaimFSM(f.p, applied, recs, live, delayed, uniques); err != nil {
		return err
	}
	f.applied, f.appliedKnown = applied, true
	f.passTo(applied)
	return nil
}
