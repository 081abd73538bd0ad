package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/norn-dev/norn/cluster"
)

// ErrDataDirInUse is returned by New when another process holds the data dir.
var ErrDataDirInUse = errors.New("node: data dir is in use by another nornd")

// dirLock is an exclusive flock on DataDir/LOCK, held for the node's life;
// the file holds the holder's pid for the error message.
type dirLock struct{ f *os.File }

func lockDataDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("node: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (pid %s)", ErrDataDirInUse, dir, strings.TrimSpace(string(b)))
		}
		return nil, fmt.Errorf("node: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{f: f}, nil
}

func (l *dirLock) release() error { return l.f.Close() }

// dataDirMeta is DataDir/norn.json: what a data dir was created with and
// must be reopened with, and its incarnation.
type dataDirMeta struct {
	Partitions int `json:"partitions"`
	// Incarnation names the data dir's Raft state (cluster/incarnation.go):
	// random, made with the store. Absent from a norn.json written
	// before incarnations; the first start that reads one writes it.
	Incarnation string `json:"incarnation,omitempty"`
}

// openDataDirMeta records P and a new incarnation in a new data dir, and
// refuses to open one created with a different P (every task would map
// to another partition). It returns the data dir's incarnation. A data
// dir whose norn.json has none (written before incarnations) gets one,
// and so does one whose store is new (storeExists false: DataDir/db is
// absent, lost while norn.json was kept): the incarnation names the Raft
// state the store holds, and a new store holds none of the old one. A new
// incarnation is written durably before the node can gossip it.
func openDataDirMeta(dir string, partitions int, storeExists bool) (string, error) {
	path := filepath.Join(dir, "norn.json")
	m := dataDirMeta{Partitions: partitions}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return "", fmt.Errorf("node: %w", err)
	default:
		if err := json.Unmarshal(b, &m); err != nil {
			return "", fmt.Errorf("node: %s: %w", path, err)
		}
		if m.Partitions != partitions {
			return "", fmt.Errorf("node: data dir %s was created with %d partitions; it cannot be opened with %d", dir, m.Partitions, partitions)
		}
		if m.Incarnation != "" && storeExists {
			return m.Incarnation, nil
		}
	}
	if m.Incarnation, err = cluster.NewIncarnation(); err != nil {
		return "", fmt.Errorf("node: %w", err)
	}
	b, _ = json.Marshal(m)
	if err := writeFileSynced(path, append(b, '\n')); err != nil {
		return "", fmt.Errorf("node: %w", err)
	}
	return m.Incarnation, nil
}

// writeFileSynced replaces the file at path with b durably: a temporary
// file, fsync, rename, fsync of the directory.
func writeFileSynced(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncPath(filepath.Dir(path))
}
