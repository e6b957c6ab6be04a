// Package dirwatch calls a function whenever a directory changes: for a mounted ConfigMap or
// Secret (whose files Kubernetes swaps atomically through a ..data link) read again as a
// whole.
package dirwatch

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fsnotify/fsnotify"
)

// Run calls changed once the watch is in place (a change between a first read and the watch
// is not missed) and after every event in dir, until ctx ends. Watch errors are logged.
func Run(ctx context.Context, dir string, log *slog.Logger, changed func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			changed()
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			log.Warn("watching a directory", "dir", dir, "error", err)
		}
	}
}
