package host

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Go guest that panics while initialising traps with "unreachable"; the panic's message
// is what its runtime wrote to stderr, and the start error quotes it.
func TestStartErrorQuotesWhatAPanickingInitWrote(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	mod, err := rt.Compile(ctx, guestWasm(t, "initpanic"))
	require.NoError(t, err)
	_, err = rt.NewPlugin(ctx, mod, PluginConfig{Name: "ip"}, Environment{Logger: slog.New(slog.DiscardHandler)})
	require.Error(t, err)
	msg := err.Error()
	assert.True(t, strings.HasPrefix(msg, `plugin "ip": _initialize: trap: wasm error: unreachable`), msg)
	assert.Contains(t, msg, "\nguest stderr:\n\tpanic: initpanic: cannot load the filter's settings\n\n\tgoroutine 1 [running]:\n\tmain.init.")
	var f *Failure
	require.ErrorAs(t, err, &f)
	assert.True(t, strings.HasPrefix(f.Stderr, "panic: initpanic: cannot load the filter's settings\n"), f.Stderr)
}

// A callback's Failure quotes what the guest wrote to stderr during that callback, and
// only that: output of earlier callbacks is not blamed on a later trap.
func TestCallbackFailureQuotesItsOwnStderr(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	res, _ := f.op(t, "panic")
	require.NotNil(t, res.Failure)
	assert.True(t, strings.HasPrefix(res.Failure.Stderr, "panic: guest panic on purpose\n\ngoroutine 1 [running]:\nmain.faults("),
		res.Failure.Stderr)
	assert.Contains(t, res.Failure.Error(),
		`plugin "kitchen" instance 0: proxy_on_request_headers failed (trap): wasm error: unreachable`)
	assert.Contains(t, res.Failure.Error(), "\nguest stderr:\n\tpanic: guest panic on purpose\n\n\tgoroutine 1 [running]:\n")
	js, err := json.Marshal(res.Failure)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"stderr":"panic: guest panic on purpose\n`)

	res, _ = f.op(t, "log-levels") // prints "stderr line from guest" and succeeds
	require.Nil(t, res.Failure)
	res, _ = f.op(t, "trap")
	require.NotNil(t, res.Failure)
	assert.Empty(t, res.Failure.Stderr)
	assert.NotContains(t, res.Failure.Error(), "guest stderr")
}

// The capture keeps the start and the end of long output, and says how much it left out.
func TestOutputCaptureIsBounded(t *testing.T) {
	var c outputCapture
	_, _ = c.Write([]byte("panic: first line\n"))
	for range 1000 {
		n, err := c.Write([]byte("frame 0123456789\n"))
		require.NoError(t, err)
		require.Equal(t, 17, n)
	}
	_, _ = c.Write([]byte("last line\n"))
	got := c.String()
	// 18+17000+10 bytes written; kept: the first line and 59 whole frames (1021 bytes),
	// and 180 whole frames and the last line (3070 bytes), cut at line ends.
	assert.True(t, strings.HasPrefix(got, "panic: first line\nframe 0123456789\n"), got[:40])
	assert.Contains(t, got, "\nframe 0123456789\n... (12937 bytes omitted) ...\nframe 0123456789\n")
	assert.True(t, strings.HasSuffix(got, "frame 0123456789\nlast line\n"))
	assert.LessOrEqual(t, len(got), stderrHead+stderrTail+40)

	c.reset()
	_, _ = c.Write([]byte("short"))
	assert.Equal(t, "short", c.String())

	// A start whose only line end is its first byte is cut there: the line that runs past
	// the kept start is left out whole, as the one that runs into the kept end.
	c.reset()
	_, _ = c.Write([]byte("\n" + strings.Repeat("x", 5000) + "\nend\n"))
	assert.Equal(t, "\n... (5001 bytes omitted) ...\nend\n", c.String())
}

// A file that is not WebAssembly is refused by its digest unless the embedder names it.
func TestCompileErrorNamesTheModule(t *testing.T) {
	_, err := newRuntime(t).Compile(context.Background(), []byte("(module)"))
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	assert.Regexp(t, `^wasm module [0-9a-f]{12}: compile: not a WebAssembly binary: it starts with "\(mod", not "\\x00asm"$`, err.Error())
	assert.Equal(t, `wasm module build/f.wasm: compile: not a WebAssembly binary: it starts with "(mod", not "\x00asm"`,
		ce.Named("build/f.wasm").Error())
	assert.Empty(t, ce.Name, "Named copies")
}
