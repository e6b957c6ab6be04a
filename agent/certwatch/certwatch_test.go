package certwatch

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func run(t *testing.T, w *Watcher) <-chan string {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan string, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx, func(h string) { ch <- h })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

func next(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case h := <-ch:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("no hash reported")
		return ""
	}
}

func TestFileEventReportsNewHash(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "cert-chain.pem")
	require.NoError(t, os.WriteFile(cert, []byte("v1"), 0o600))
	// A long period: only the file event can deliver the change in time.
	w := New([]string{cert, filepath.Join(dir, "key.pem")}, time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ch := run(t, w)
	first := next(t, ch)
	require.NoError(t, os.WriteFile(cert, []byte("v2"), 0o600))
	second := next(t, ch)
	assert.NotEqual(t, first, second)
	assert.Equal(t, w.Hash(), second)
}

func TestPeriodicHashCatchesChangesWithoutEvents(t *testing.T) {
	// The watched file lives in a directory that does not exist yet, so fsnotify cannot
	// watch it; only the periodic check sees the file appear.
	dir := filepath.Join(t.TempDir(), "later")
	cert := filepath.Join(dir, "root-cert.pem")
	w := New([]string{cert}, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ch := run(t, w)
	first := next(t, ch)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(cert, []byte("root"), 0o600))
	assert.NotEqual(t, first, next(t, ch))
}

func TestUnchangedContentIsNoChange(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "cert-chain.pem")
	require.NoError(t, os.WriteFile(cert, []byte("v1"), 0o600))
	w := New([]string{cert}, 50*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ch := run(t, w)
	next(t, ch)
	require.NoError(t, os.WriteFile(cert, []byte("v1"), 0o600)) // rewritten, same bytes
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o600))
	select {
	case h := <-ch:
		t.Fatalf("reported %s for unchanged content", h)
	case <-time.After(400 * time.Millisecond): // several periodic checks and the settle time
	}
}
