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
// must be reopened with.
type dataDirMeta struct {
	Partitions int `json:"partitions"`
}

// checkDataDirMeta records P in a new data dir, and refuses to open one
// created with a different P (every task would map to another partition).
func checkDataDirMeta(dir string, partitions int) error {
	path := filepath.Join(dir, "norn.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b, _ = json.Marshal(dataDirMeta{Partitions: partitions})
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("node: %w", err)
		}
		return os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	var m dataDirMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("node: %s: %w", path, err)
	}
	if m.Partitions != partitions {
		return fmt.Errorf("node: data dir %s was created with %d partitions; it cannot be opened with %d", dir, m.Partitions, partitions)
	}
	return nil
}
