package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/apierr"
)

// Backuper writes a checkpoint of the node's data directory to path,
// which does not exist yet (its parent does), and returns the size of its
// files in bytes. A path that exists by the time it is written is an
// error wrapping os.ErrExist. The node's Backup implements it.
type Backuper func(path string) (sizeBytes uint64, err error)

func (a adminService) Backup(ctx context.Context, req *connect.Request[nornv1.BackupRequest]) (*connect.Response[nornv1.BackupResponse], error) {
	sv := a.sv
	if sv.cfg.Backup == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this node cannot make backups"))
	}
	dir := req.Msg.GetDir()
	if err := checkBackupDir(dir, sv.cfg.DataDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("dir: %w", err))
	}
	path := filepath.Join(dir, sv.cfg.NodeID)
	start := time.Now()
	size, err := sv.cfg.Backup(path)
	switch {
	case errors.Is(err, os.ErrExist):
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("dir: %s exists already", path))
	case err != nil:
		return nil, apierr.From(fmt.Errorf("backup to %s: %w", path, err))
	}
	return connect.NewResponse(&nornv1.BackupResponse{NodeId: sv.cfg.NodeID, Path: path, SizeBytes: size,
		Took: durationpb.New(time.Since(start))}), nil
}

// checkBackupDir refuses a backup directory that is not absolute and
// clean, or that is inside the data directory (or holds it).
func checkBackupDir(dir, dataDir string) error {
	switch {
	case dir == "":
		return apierr.Invalid("dir", "required")
	case !filepath.IsAbs(dir):
		return apierr.Invalid("dir", "%q is not an absolute path (it is a directory on the node's machine)", dir)
	case filepath.Clean(dir) != dir:
		return apierr.Invalid("dir", "%q is not a clean path (want %q)", dir, filepath.Clean(dir))
	}
	if dataDir == "" {
		return nil
	}
	data, err := filepath.Abs(dataDir)
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	if within(dir, data) || within(data, dir) {
		return apierr.Invalid("dir", "%q overlaps the node's data directory %q", dir, data)
	}
	return nil
}

// within reports whether path is dir or inside it (both clean, absolute).
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+string(filepath.Separator)) || dir == string(filepath.Separator)
}
