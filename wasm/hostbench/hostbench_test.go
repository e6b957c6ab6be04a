package hostbench

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// kitchen loads the host's test guest that adds x-response-added to every response, and
// logs its response callbacks' end_of_stream into logs when a request has x-op: log-body.
func kitchen(t *testing.T, logs *logLines) *Filter {
	t.Helper()
	ctx := context.Background()
	art, err := wasmbuild.Build(ctx, "../host/testdata/guests/kitchen", wasmbuild.Options{})
	require.NoError(t, err)
	code, err := art.Bytes()
	require.NoError(t, err)
	f, err := Load(ctx, code, host.RuntimeConfig{}, host.PluginConfig{Name: "kitchen"},
		host.Environment{Logger: slog.New(logs)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close(context.Background()) })
	return f
}

// logLines keeps the guest's log messages that name a callback.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "-callback ") {
		l.mu.Lock()
		l.lines = append(l.lines, r.Message)
		l.mu.Unlock()
	}
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// take returns the lines logged since the last take.
func (l *logLines) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// callbacks is the number of guest callbacks x takes.
func callbacks(t *testing.T, f *Filter, x Exchange) (int64, *host.Headers) {
	t.Helper()
	before := f.Plugin.Stats().Callbacks
	resp, err := f.Do(context.Background(), x)
	require.NoError(t, err)
	st := f.Plugin.Stats()
	require.Empty(t, st.Failures)
	return st.Callbacks - before, resp
}

func TestDoSendsTheWholeExchange(t *testing.T) {
	logs := &logLines{}
	f := kitchen(t, logs)
	x := Exchange{Request: [][2]string{{":method", "GET"}, {":path", "/"}, {"x-op", "log-body"}},
		Response: [][2]string{{":status", "200"}}}
	headersOnly, resp := callbacks(t, f, x)
	assert.Equal(t, []string{"x-headers-callback response eos=1"}, logs.take(), "the headers end a response without a body")
	v, ok := resp.Get("x-response-added")
	assert.True(t, ok, "the response headers as the filter left them")
	assert.Equal(t, "1", v, "the filter saw the one response header")
	// context create, request headers, response headers, log, done, delete
	assert.GreaterOrEqual(t, headersOnly, int64(6))

	x.ResponseBody = []byte("ok")
	withBody, _ := callbacks(t, f, x)
	assert.Equal(t, headersOnly+1, withBody, "the body is one more callback")
	assert.Equal(t, []string{"x-headers-callback response eos=0", "x-body-callback response size=2 eos=1"}, logs.take(),
		"the body, not the headers, ends a response with a body")
}
