package node

import (
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
