// Package certwatch tells the agent when the proxy's certificate files change: fsnotify
// on their directories for a prompt reaction, and a periodic sha256 of their contents
// because file events are lost on some volume types (Kubernetes secrets swap symlinks).
package certwatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultInterval is pilot-agent's period for the hash check.
const DefaultInterval = 10 * time.Second

// settle is how long the files must be quiet after an event before they are hashed.
const settle = 100 * time.Millisecond

// Watcher hashes a set of files.
type Watcher struct {
	files    []string
	interval time.Duration
	log      *slog.Logger
}

// New watches files, rechecking their hash every interval.
func New(files []string, interval time.Duration, log *slog.Logger) *Watcher {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Watcher{files: files, interval: interval, log: log.With("scope", "certwatch")}
}

// Hash is the sha256 over every file's name and content; a missing file counts as
// absent, so a certificate that appears later is a change too.
func (w *Watcher) Hash() string {
	h := sha256.New()
	for _, f := range w.files {
		h.Write([]byte(f))
		h.Write([]byte{0})
		b, err := os.ReadFile(f)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			h.Write([]byte("absent"))
		case err != nil:
			h.Write([]byte("unreadable: " + err.Error()))
		default:
			h.Write(b)
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Run calls onChange with the current hash at once (the proxy's first config), then
// every time the hash changes, until ctx ends.
func (w *Watcher) Run(ctx context.Context, onChange func(hash string)) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if fw, err := fsnotify.NewWatcher(); err != nil {
		w.log.Warn("no file events, hash check only", "err", err)
	} else {
		defer fw.Close()
		seen := map[string]bool{}
		for _, f := range w.files {
			dir := filepath.Dir(f)
			if seen[dir] {
				continue
			}
			seen[dir] = true
			if err := fw.Add(dir); err != nil {
				w.log.Warn("cannot watch directory, hash check only", "dir", dir, "err", err)
			}
		}
		events, errs = fw.Events, fw.Errors
	}
	// The first hash is taken once the watch is in place, so no change falls between.
	last := w.Hash()
	onChange(last)
	w.log.Info("watching certificates", "files", w.files, "interval", w.interval)

	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	// A write is a truncate and then the bytes, and a secret update touches several
	// files: hash once the directory has been quiet for a moment, not on every event.
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.log.Warn("file watch error", "err", err)
			continue
		case _, ok := <-events:
			if !ok {
				events = nil
			} else {
				quiet.Reset(settle)
			}
			continue
		case <-quiet.C:
		case <-tick.C:
		}
		if h := w.Hash(); h != last {
			w.log.Info("certificates changed", "hash", h[:12])
			last = h
			onChange(h)
		}
	}
}
