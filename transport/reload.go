package transport

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Reloader runs a load function again when its files change: the TLS
// certificates (Certs) and the access file (access.Rules). A failed load
// keeps what the last good one installed. Safe for concurrent use.
type Reloader struct {
	paths []string
	load  func() error // reads the files and installs what it read

	mu    sync.Mutex // serializes loads
	stamp string     // the files' sizes and modification times at the last good load
}

// NewReloader loads once and returns the reloader of paths.
func NewReloader(load func() error, paths ...string) (*Reloader, error) {
	r := &Reloader{paths: paths, load: load}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload loads again (SIGHUP).
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamp := r.filesStamp()
	if err := r.load(); err != nil {
		return err
	}
	r.stamp = stamp
	return nil
}

// Changed reports whether the files changed since the last good load.
func (r *Reloader) Changed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.filesStamp() != r.stamp
}

// Watch loads again every period when the files changed, until stop is
// closed; onErr (if not nil) hears of a failed load.
func (r *Reloader) Watch(period time.Duration, stop <-chan struct{}, onErr func(error)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !r.Changed() {
			continue
		}
		if err := r.Reload(); err != nil && onErr != nil {
			onErr(err)
		}
	}
}

// filesStamp sums up the files' sizes and modification times.
func (r *Reloader) filesStamp() string {
	var b strings.Builder
	for _, p := range r.paths {
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
		} else {
			b.WriteString("-;")
		}
	}
	return b.String()
}
