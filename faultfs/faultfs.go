package faultfs

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// FS keeps the unsynced writes of every file in memory (see the package
// doc). It is safe for concurrent use.
type FS struct {
	inner vfs.FS

	mu    sync.Mutex
	files map[string]*inode // by cleaned path; a file with no overlay may be missing
}

// New wraps inner (vfs.Default for the OS filesystem).
func New(inner vfs.FS) *FS {
	return &FS{inner: inner, files: map[string]*inode{}}
}

var _ vfs.FS = (*FS)(nil)

// inode is a file's overlay: the writes not yet synced, in write order.
type inode struct {
	mu   sync.Mutex
	exts []extent
	end  int64 // the largest offset an extent reaches
}

type extent struct {
	off  int64
	data []byte
}

func (in *inode) write(p []byte, off int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if k := len(in.exts) - 1; k >= 0 && in.exts[k].off+int64(len(in.exts[k].data)) == off {
		in.exts[k].data = append(in.exts[k].data, p...) // sequential: one extent
	} else {
		in.exts = append(in.exts, extent{off: off, data: append([]byte(nil), p...)})
	}
	in.end = max(in.end, off+int64(len(p)))
}

// pending reports whether the inode holds unsynced bytes.
func (in *inode) pending() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.exts) > 0
}

// size is the file's size as its readers see it, given its size on disk.
// The caller holds in.mu.
func (in *inode) size(disk int64) int64 {
	if len(in.exts) == 0 {
		return disk
	}
	return max(disk, in.end)
}

// reset drops the overlay (a truncating Create).
func (in *inode) reset() {
	in.mu.Lock()
	in.exts, in.end = nil, 0
	in.mu.Unlock()
}

func (fs *FS) key(name string) string { return filepath.Clean(name) }

// inode returns name's overlay, creating it.
func (fs *FS) inode(name string) *inode {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	k := fs.key(name)
	in := fs.files[k]
	if in == nil {
		in = &inode{}
		fs.files[k] = in
	}
	return in
}

// Unsynced reports whether name has writes not yet synced (for tests).
func (fs *FS) Unsynced(name string) bool {
	fs.mu.Lock()
	in := fs.files[fs.key(name)]
	fs.mu.Unlock()
	return in != nil && in.pending()
}

func (fs *FS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &file{inner: f, in: fs.inode(name)}, nil
}

// Create creates or truncates name (at once on disk) and drops its overlay.
func (fs *FS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.inner.Create(name, category)
	if err == nil {
		fs.inode(name).reset()
	}
	return fs.wrap(name, f, err)
}

// Link links newname to oldname's file, overlay included.
func (fs *FS) Link(oldname, newname string) error {
	if err := fs.inner.Link(oldname, newname); err != nil {
		return err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if in := fs.files[fs.key(oldname)]; in != nil {
		fs.files[fs.key(newname)] = in
	}
	return nil
}

// Open opens name for reading; reads see its overlay.
func (fs *FS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.inner.Open(name, opts...)
	return fs.wrap(name, f, err)
}

// OpenReadWrite opens name for reading and writing, creating it.
func (fs *FS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.inner.OpenReadWrite(name, category, opts...)
	return fs.wrap(name, f, err)
}

// OpenDir opens a directory of the underlying filesystem.
func (fs *FS) OpenDir(name string) (vfs.File, error) { return fs.inner.OpenDir(name) }

// Remove removes name and drops its overlay.
func (fs *FS) Remove(name string) error {
	if err := fs.inner.Remove(name); err != nil {
		return err
	}
	fs.mu.Lock()
	delete(fs.files, fs.key(name))
	fs.mu.Unlock()
	return nil
}

// RemoveAll removes name and everything under it, overlays included.
func (fs *FS) RemoveAll(name string) error {
	if err := fs.inner.RemoveAll(name); err != nil {
		return err
	}
	k := fs.key(name)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for p := range fs.files {
		if p == k || strings.HasPrefix(p, k+string(filepath.Separator)) {
			delete(fs.files, p)
		}
	}
	return nil
}

// Rename renames oldname; its overlay follows.
func (fs *FS) Rename(oldname, newname string) error {
	if err := fs.inner.Rename(oldname, newname); err != nil {
		return err
	}
	fs.move(oldname, newname)
	return nil
}

func (fs *FS) move(oldname, newname string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	o, n := fs.key(oldname), fs.key(newname)
	if o == n {
		return
	}
	if in := fs.files[o]; in != nil {
		fs.files[n] = in
	} else {
		delete(fs.files, n)
	}
	delete(fs.files, o)
}

// ReuseForWrite renames oldname to newname and opens it for writing.
func (fs *FS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.inner.ReuseForWrite(oldname, newname, category)
	if err == nil {
		fs.move(oldname, newname)
	}
	return fs.wrap(newname, f, err)
}

// MkdirAll creates dir on the underlying filesystem.
func (fs *FS) MkdirAll(dir string, perm os.FileMode) error { return fs.inner.MkdirAll(dir, perm) }

// Lock locks name on the underlying filesystem.
func (fs *FS) Lock(name string) (io.Closer, error) { return fs.inner.Lock(name) }

// List lists dir on the underlying filesystem.
func (fs *FS) List(dir string) ([]string, error) { return fs.inner.List(dir) }

// Stat describes name; its size includes the overlay.
func (fs *FS) Stat(name string) (vfs.FileInfo, error) {
	fi, err := fs.inner.Stat(name)
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	in := fs.files[fs.key(name)]
	fs.mu.Unlock()
	if in == nil {
		return fi, nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return sizedInfo{fi, in.size(fi.Size())}, nil
}

// PathBase is the underlying filesystem's.
func (fs *FS) PathBase(path string) string { return fs.inner.PathBase(path) }

// PathJoin is the underlying filesystem's.
func (fs *FS) PathJoin(elem ...string) string { return fs.inner.PathJoin(elem...) }

// PathDir is the underlying filesystem's.
func (fs *FS) PathDir(path string) string { return fs.inner.PathDir(path) }

// GetDiskUsage is the underlying filesystem's.
func (fs *FS) GetDiskUsage(path string) (vfs.DiskUsage, error) { return fs.inner.GetDiskUsage(path) }

// Unwrap returns nil: no caller may reach the underlying filesystem past
// the overlay.
func (fs *FS) Unwrap() vfs.FS { return nil }

// sizedInfo is a FileInfo whose size includes the overlay.
type sizedInfo struct {
	vfs.FileInfo
	size int64
}

func (s sizedInfo) Size() int64 { return s.size }

// file is a handle: its own offset over the file's shared overlay.
type file struct {
	inner vfs.File
	in    *inode

	mu  sync.Mutex // guards off
	off int64
}

func (f *file) Close() error { return f.inner.Close() }

func (f *file) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.ReadAt(p, f.off)
	f.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// ReadAt reads the file on disk with the overlay's bytes laid over it.
func (f *file) ReadAt(p []byte, off int64) (int, error) {
	in := f.in
	in.mu.Lock()
	if len(in.exts) == 0 {
		in.mu.Unlock()
		return f.inner.ReadAt(p, off)
	}
	defer in.mu.Unlock()
	fi, err := f.inner.Stat()
	if err != nil {
		return 0, err
	}
	size := in.size(fi.Size())
	if off >= size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-off))
	buf := p[:n]
	m, err := f.inner.ReadAt(buf, off)
	if err != nil && err != io.EOF {
		return 0, err
	}
	clear(buf[m:]) // past the end on disk: only the overlay has bytes there
	for _, e := range in.exts {
		lo, hi := max(off, e.off), min(off+int64(n), e.off+int64(len(e.data)))
		if lo < hi {
			copy(buf[lo-off:hi-off], e.data[lo-e.off:hi-e.off])
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *file) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.WriteAt(p, f.off)
	f.off += int64(n)
	return n, err
}

// WriteAt writes to the overlay only.
func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.in.write(p, off)
	return len(p), nil
}

// Preallocate does nothing.
func (f *file) Preallocate(offset, length int64) error { return nil }

// Stat describes the file; its size includes the overlay.
func (f *file) Stat() (vfs.FileInfo, error) {
	fi, err := f.inner.Stat()
	if err != nil {
		return nil, err
	}
	f.in.mu.Lock()
	defer f.in.mu.Unlock()
	return sizedInfo{fi, f.in.size(fi.Size())}, nil
}

// flush writes the overlay to the file on disk and syncs it with sync;
// the overlay is dropped once synced.
func (f *file) flush(sync func() error) error {
	in := f.in
	in.mu.Lock()
	defer in.mu.Unlock()
	for len(in.exts) > 0 {
		e := in.exts[0]
		if _, err := f.inner.WriteAt(e.data, e.off); err != nil {
			return err
		}
		in.exts = in.exts[1:]
	}
	in.exts, in.end = nil, 0
	return sync()
}

// Sync writes the overlay to disk and syncs the file.
func (f *file) Sync() error { return f.flush(f.inner.Sync) }

// SyncData writes the overlay to disk and syncs the file's data.
func (f *file) SyncData() error { return f.flush(f.inner.SyncData) }

// SyncTo syncs the whole file (always a full sync).
func (f *file) SyncTo(int64) (bool, error) {
	if err := f.flush(f.inner.Sync); err != nil {
		return false, err
	}
	return true, nil
}

// Prefetch does nothing.
func (f *file) Prefetch(offset, length int64) error { return nil }

// Fd reports no descriptor, so no caller reads or writes around the
// overlay.
func (f *file) Fd() uintptr { return vfs.InvalidFd }
