package filedir

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/wasmesh/wasmesh/controlplane/source"
)

// Watching is closed once Run watches the directory tree: a change made after it is seen.
func (s *Source) Watching() <-chan struct{} { return s.watching }

// Run implements source.Source: it publishes what is in force to sink (Publish), then
// watches the directory until ctx ends, reading again what changes.
func (s *Source) Run(ctx context.Context, sink source.Sink) error {
	if err := s.Publish(sink); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", s.dir, err)
	}
	defer w.Close()
	if err := addTree(w, s.dir); err != nil {
		return err
	}
	s.watchingOnce.Do(func() { close(s.watching) })
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			paths := map[string]struct{}{}
			seen := func(ev fsnotify.Event) {
				paths[ev.Name] = struct{}{}
				if ev.Has(fsnotify.Create) {
					if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() {
						_ = addTree(w, ev.Name)
					}
				}
			}
			seen(ev)
			// Coalesce a burst of events (an editor's truncate+write+rename+chmod) into one
			// read once the directory has been quiet for a moment.
			settle(ctx, w.Events, seen, 50*time.Millisecond, time.Second)
			if err := s.SyncPaths(paths); err != nil {
				s.log.Error("config directory unreadable; keeping the last good configs", "error", err)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// Events may have been lost (an overflowing queue): read the whole tree again.
			s.log.Error("watch error; reading the whole directory again", "error", err)
			if err := s.Sync(); err != nil {
				s.log.Error("config directory unreadable; keeping the last good configs", "error", err)
			}
		}
	}
}

// settle hands events to seen until none arrived for quiet, or max has passed.
func settle(ctx context.Context, ch <-chan fsnotify.Event, seen func(fsnotify.Event), quiet, max time.Duration) {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	q := time.NewTimer(quiet)
	defer q.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return
			}
			seen(ev)
			q.Reset(quiet)
		case <-q.C:
			return
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

func addTree(w *fsnotify.Watcher, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if err := w.Add(p); err != nil {
				return fmt.Errorf("watching %s: %w", p, err)
			}
		}
		return nil
	})
}
