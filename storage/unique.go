package storage

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// The claim FSM's unique key records (docs/SCHEDULING.md, "Unique
// tasks"), beside its task records under tag 0x12 of the key's partition:
//
//	p 0x12 0x02 queue 0x00 key -> who holds the key (opaque to storage)
//
// A queue has no 0x00 byte and a key no control character, so the pair
// is one key.
const fsmUnique byte = 0x02

func uniquePrefix(p uint16) []byte { return append(partitionPrefix(p, tagClaimFSM), fsmUnique) }

func uniqueRecordKey(p uint16, queue, key string) []byte {
	k := append(uniquePrefix(p), queue...)
	k = append(k, 0)
	return append(k, key...)
}

// FSMUnique is the claim FSM's record of one unique key. Storage does not
// interpret Value; nil Value deletes the record.
type FSMUnique struct {
	Queue, Key string
	Value      []byte
}

// ClaimFSMUnique returns partition p's record of the unique key (queue,
// key), or ErrNotFound.
func (s *Store) ClaimFSMUnique(p uint16, queue, key string) ([]byte, error) {
	return s.get(uniqueRecordKey(p, queue, key))
}

// setUniques adds the unique key records of an FSM update to sb.
func setUniques(sb *sortedBatch, p uint16, us []FSMUnique) error {
	for _, u := range us {
		var err error
		if u.Value == nil {
			err = sb.Delete(uniqueRecordKey(p, u.Queue, u.Key))
		} else {
			err = sb.Set(uniqueRecordKey(p, u.Queue, u.Key), u.Value)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Uniques calls fn for every unique key record of the snapshot's
// partition, in (queue, key) order. value is valid only during the call.
func (f *FSMSnapshot) Uniques(fn func(queue, key string, value []byte) error) error {
	return scanUniques(f.snap, f.p, nil, fn)
}

// ScanUniques calls fn for partition p's unique key records after the
// record (queue, key) (both "" for the first), in order, until fn
// returns false or limit records were seen.
func (s *Store) ScanUniques(p uint16, queue, key string, limit int, fn func(queue, key string, value []byte) bool) error {
	var after []byte
	if queue != "" {
		after = uniqueRecordKey(p, queue, key)
	}
	n := 0
	return ignoreStop(scanUniques(s.db, p, after, func(q, k string, v []byte) error {
		if n++; n > limit || !fn(q, k, v) {
			return errStopScan
		}
		return nil
	}))
}

var errStopScan = errors.New("storage: stop")

func ignoreStop(err error) error {
	if errors.Is(err, errStopScan) {
		return nil
	}
	return err
}

// scanUniques walks p's unique records in r after the key after (nil:
// from the first).
func scanUniques(r pebble.Reader, p uint16, after []byte, fn func(queue, key string, value []byte) error) error {
	prefix := uniquePrefix(p)
	lower := prefix
	if after != nil {
		lower = append(bytes.Clone(after), 0)
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		rest := it.Key()[len(prefix):]
		i := bytes.IndexByte(rest, 0)
		if i <= 0 || i == len(rest)-1 {
			return corrupt(it.Key(), "bad unique key record key")
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if err := fn(string(rest[:i]), string(rest[i+1:]), v); err != nil {
			return err
		}
	}
	return it.Error()
}

// restoreUniques replaces p's unique key records in sb with us.
func restoreUniques(sb *sortedBatch, p uint16, us []FSMUnique) error {
	prefix := uniquePrefix(p)
	sb.DeleteRange(prefix, prefixEnd(prefix))
	for _, u := range us {
		if u.Value == nil {
			return fmt.Errorf("storage: restore of partition %d: unique key %q of queue %q has no record", p, u.Key, u.Queue)
		}
		if err := sb.Set(uniqueRecordKey(p, u.Queue, u.Key), u.Value); err != nil {
			return err
		}
	}
	return nil
}
