package node

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Backup writes a checkpoint of the node's data directory to path, which
// must not exist (its parent must), laid out as a data directory: a node
// started with -data-dir path (the same -partitions, -node-id and
// addresses) serves the tasks the node stored when the checkpoint was
// taken. It holds:
//
//	db/        a Pebble checkpoint of the store (storage.Store.Checkpoint)
//	raft/      the Raft snapshots of the partition groups and the meta group
//	norn.json  and ring.json, as in the data directory
//
// The snapshots are copied before the store's checkpoint is taken, so
// that none is newer than the Raft logs and claim state beside it. The
// checkpoint is written under a temporary name next to path and renamed
// to path once complete and synced: path exists only when whole. It
// returns the size of the checkpoint's files in bytes. A path that exists
// already is an error wrapping os.ErrExist.
func (n *Node) Backup(path string) (uint64, error) {
	if _, err := os.Lstat(path); err == nil {
		return 0, fmt.Errorf("%s: %w", path, os.ErrExist)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".partial-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return 0, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := copySnapshots(filepath.Join(n.cfg.DataDir, "raft"), filepath.Join(tmp, "raft")); err != nil {
		return 0, fmt.Errorf("raft snapshots: %w", err)
	}
	if err := n.store.Checkpoint(filepath.Join(tmp, "db")); err != nil {
		return 0, err
	}
	for _, name := range []string{"norn.json", "ring.json"} {
		err := copyFile(filepath.Join(n.cfg.DataDir, name), filepath.Join(tmp, name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
	}
	size, err := syncTree(tmp)
	if err != nil {
		return 0, err
	}
	// Rename does not refuse an existing empty directory: look again.
	if _, err := os.Lstat(path); err == nil {
		return 0, fmt.Errorf("%s: %w", path, os.ErrExist)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, err
	}
	if err := syncPath(filepath.Dir(path)); err != nil {
		return 0, err
	}
	ok = true
	return size, nil
}

// copySnapshots copies the complete Raft snapshots under src (raft/<group>/
// <snapshot>/, hashicorp/raft's file snapshot store) to dst. Snapshots
// being written (a ".tmp" suffix) are left out, and one that Raft removes
// while it is copied is dropped from the copy: the group keeps at least
// one newer snapshot, which is copied.
func copySnapshots(src, dst string) error {
	groups, err := os.ReadDir(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, g := range groups {
		if !g.IsDir() {
			continue
		}
		snaps, err := os.ReadDir(filepath.Join(src, g.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // the group was dropped meanwhile
			}
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, g.Name()), 0o755); err != nil {
			return err
		}
		for _, s := range snaps {
			if !s.IsDir() || strings.HasSuffix(s.Name(), ".tmp") {
				continue
			}
			to := filepath.Join(dst, g.Name(), s.Name())
			err := copyDir(filepath.Join(src, g.Name(), s.Name()), to)
			if errors.Is(err, fs.ErrNotExist) {
				err = os.RemoveAll(to) // reaped while copied
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// copyDir copies the regular files of directory src into a new dst.
func copyDir(src, dst string) error {
	files, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		if f.Type().IsRegular() {
			if err := copyFile(filepath.Join(src, f.Name()), filepath.Join(dst, f.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyFile copies the regular file src to a new file dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// syncTree fsyncs every file and directory under root (root included) and
// returns the size of its regular files in bytes.
func syncTree(root string) (uint64, error) {
	var size uint64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			size += uint64(info.Size())
		} else if !d.IsDir() {
			return nil
		}
		return syncPath(p)
	})
	return size, err
}

// syncPath fsyncs the file or directory at path.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
