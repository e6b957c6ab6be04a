package host

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// guestWasm builds testdata/guests/<name> (cached on disk by content).
func guestWasm(tb testing.TB, name string) []byte {
	tb.Helper()
	art, err := wasmbuild.Build(context.Background(), filepath.Join("testdata", "guests", name), wasmbuild.Options{})
	require.NoError(tb, err)
	b, err := art.Bytes()
	require.NoError(tb, err)
	return b
}

// newRuntime returns a fresh Runtime. Tests share wazero's on-disk compilation cache so
// that each new Runtime does not spend a second compiling the same guest again; the
// Runtime still counts its own compilations.
func newRuntime(tb testing.TB) *Runtime {
	tb.Helper()
	rt, err := NewRuntime(context.Background(), RuntimeConfig{
		Logger:              slog.New(slog.DiscardHandler),
		CompilationCacheDir: filepath.Join(os.TempDir(), "wasmesh-host-test-wazero-cache"),
	})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt
}

// logRecorder is an slog.Handler that keeps every record, at every level.
type logRecorder struct {
	mu      sync.Mutex
	records []logRecord
	notify  changes // each record
}

type logRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool { rec.Attrs[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.records = append(l.records, rec)
	l.mu.Unlock()
	l.notify.changed()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.records))
	for i, r := range l.records {
		out[i] = r.Msg
	}
	return out
}

func (l *logRecorder) find(prefix string) (logRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if strings.HasPrefix(r.Msg, prefix) {
			return r, true
		}
	}
	return logRecord{}, false
}

// changes tells waiters that a recorder got something new: the channel next hands out is
// closed at the following change, so a test waits for an event instead of polling.
type changes struct {
	mu sync.Mutex
	ch chan struct{}
}

// next returns a channel closed at the first change after this call.
func (c *changes) next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

func (c *changes) changed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}

// eventually checks cond after each change of what c watches, failing after 10 s.
func eventually(tb testing.TB, c *changes, cond func() bool, msg string) {
	tb.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		next := c.next() // before cond: a change while cond runs still wakes the wait
		if cond() {
			return
		}
		select {
		case <-next:
		case <-deadline.C:
			tb.Fatalf("condition not met: %s", msg)
		}
	}
}

// fixture is a plugin of one test guest with its logs recorded.
type fixture struct {
	rt   *Runtime
	p    *Plugin
	logs *logRecorder
}

func newFixture(tb testing.TB, guest string, cfg PluginConfig, env Environment) *fixture {
	tb.Helper()
	return newFixtureOf(tb, guest, guestWasm(tb, guest), cfg, env)
}

// newFixtureOf is newFixture for a module built elsewhere.
func newFixtureOf(tb testing.TB, guest string, wasm []byte, cfg PluginConfig, env Environment) *fixture {
	tb.Helper()
	ctx := context.Background()
	rt := newRuntime(tb)
	mod, err := rt.Compile(ctx, wasm)
	require.NoError(tb, err)
	logs := &logRecorder{}
	if env.Logger == nil {
		env.Logger = slog.New(logs)
	}
	if cfg.Name == "" {
		cfg.Name = guest
	}
	if cfg.CallbackTimeout == 0 {
		// Tests about deadlines set their own; the others must not hit one on a loaded
		// machine or under the race detector (a Go guest's start-up takes seconds there).
		cfg.CallbackTimeout = time.Minute
	}
	p, err := rt.NewPlugin(ctx, mod, cfg, env)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = p.Close(context.Background()) })
	return &fixture{rt: rt, p: p, logs: logs}
}

// headersOnly runs a request with the given headers through request headers and returns
// the result and the (modified) map; the stream is left open.
func (f *fixture) headersOnly(tb testing.TB, opts StreamOptions, pairs ...[2]string) (*HTTPStream, Result, *Headers) {
	tb.Helper()
	ctx := context.Background()
	s, err := f.p.NewHTTPStream(ctx, opts)
	require.NoError(tb, err)
	h := NewHeaders(pairs...)
	for _, d := range [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "example.com"}} {
		if _, ok := h.Get(d[0]); !ok {
			h.Add(d[0], d[1])
		}
	}
	res := s.OnRequestHeaders(ctx, h, true)
	return s, res, h
}

// op runs one request with x-op set and finishes it.
func (f *fixture) op(tb testing.TB, op string, extra ...[2]string) (Result, *Headers) {
	tb.Helper()
	s, res, h := f.headersOnly(tb, StreamOptions{}, append([][2]string{{"x-op", op}}, extra...)...)
	s.Finish(context.Background())
	return res, h
}

func hget(h *Headers, k string) string {
	v, _ := h.Get(k)
	return v
}

// signals records a stream's signals.
type signals struct {
	mu     sync.Mutex
	got    []Signal
	notify changes // each signal
}

func (s *signals) add(sig Signal) {
	s.mu.Lock()
	s.got = append(s.got, sig)
	s.mu.Unlock()
	s.notify.changed()
}

func (s *signals) list() []Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Signal(nil), s.got...)
}
