package host

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host/internal/interrupt"
	wg "github.com/wasmesh/wasmesh/wasm/host/internal/wasmgen"
)

// Guests built with the standard Go toolchain get the host's own interrupt check rather
// than wazero's slower close-on-context-done.
func TestGoGuestsAreInterruptible(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	assert.True(t, f.p.mod.interruptible)
}

// A runaway loop is stopped at the deadline even when the process is collecting garbage
// all the while and there is a single P: the guest's goroutine must keep reaching
// preemption points, or the collector (and the watchdog behind it) would wait forever.
func TestRunawayLoopStopsUnderGCPressureOnOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f := newFixture(t, "kitchen", PluginConfig{CallbackTimeout: 200 * time.Millisecond}, Environment{})
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			runtime.GC()
		}
	}()
	s, res, _ := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "loop"})
	stop()
	wg.Wait()
	require.NotNil(t, res.Failure)
	assert.Equal(t, FailureTimeout, res.Failure.Kind, "%v", res.Failure)
	assert.ErrorIs(t, res.Failure.Err, ErrCallbackTimeout)
	s.Finish(context.Background())
}

// spinModule is a minimal proxy-wasm module whose request headers callback never returns;
// extra names an additional exported function.
func spinModule(extra string) []byte {
	funcs := []wg.Func{
		{Name: "proxy_abi_version_0_2_1"},
		{Name: "proxy_on_memory_allocate", Params: 1, Results: 1, Body: wg.I32Const(1024)},
		{Name: "proxy_on_context_create", Params: 2},
		{Name: "proxy_on_request_headers", Params: 3, Results: 1, Body: wg.Cat(wg.Loop, wg.Br(0), wg.End, wg.I32Const(0))},
	}
	if extra != "" {
		funcs = append(funcs, wg.Func{Name: extra})
	}
	return wg.Module{Funcs: funcs, MemPages: 1, Start: -1}.Encode()
}

// Both ways of stopping a guest meet the deadline: the interrupt check, and wazero's
// close-on-context-done for a module the check cannot be added to (here because it
// already exports the check's name).
func TestDeadlineWithAndWithoutTheInterruptCheck(t *testing.T) {
	for _, tc := range []struct {
		name          string
		wasm          []byte
		interruptible bool
	}{
		{"interrupt check", spinModule(""), true},
		{"close on context done", spinModule(interrupt.GlobalName), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rt := newRuntime(t)
			mod, err := rt.Compile(ctx, tc.wasm)
			require.NoError(t, err)
			assert.Equal(t, tc.interruptible, mod.interruptible)
			p, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: "spin", CallbackTimeout: 100 * time.Millisecond}, Environment{})
			require.NoError(t, err)
			defer p.Close(ctx)
			for range 2 { // the replacement instance is stopped too
				s, err := p.NewHTTPStream(ctx, StreamOptions{})
				require.NoError(t, err)
				res := s.OnRequestHeaders(ctx, NewHeaders(), true)
				require.NotNil(t, res.Failure)
				assert.Equal(t, FailureTimeout, res.Failure.Kind, "%v", res.Failure)
				s.Finish(ctx)
			}
			assert.Equal(t, int64(2), p.Stats().Failures[FailureTimeout])
		})
	}
}

// In interpreter mode every module runs with wazero's own mechanism.
func TestInterpreterStopsRunawayGuests(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(ctx, RuntimeConfig{Interpreter: true})
	require.NoError(t, err)
	defer rt.Close(ctx)
	mod, err := rt.Compile(ctx, spinModule(""))
	require.NoError(t, err)
	assert.False(t, mod.interruptible)
	p, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: "spin", CallbackTimeout: 100 * time.Millisecond}, Environment{})
	require.NoError(t, err)
	defer p.Close(ctx)
	s, err := p.NewHTTPStream(ctx, StreamOptions{})
	require.NoError(t, err)
	res := s.OnRequestHeaders(ctx, NewHeaders(), true)
	require.NotNil(t, res.Failure)
	assert.Equal(t, FailureTimeout, res.Failure.Kind)
}

// The plugin's stats time the guest's callbacks: a request counts its callbacks, and a
// callback that runs until its 150 ms deadline adds at least those 150 ms.
func TestStatsTimeTheGuestsCallbacks(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{CallbackTimeout: 150 * time.Millisecond}, Environment{})
	before := f.p.Stats()
	f.op(t, "add-header")
	after := f.p.Stats()
	// At least the context's creation, the request headers, the end and the deletion.
	assert.GreaterOrEqual(t, after.Callbacks-before.Callbacks, int64(4), "callbacks of one request")
	assert.Positive(t, after.CallbackTime-before.CallbackTime)

	res, _ := f.op(t, "loop")
	require.NotNil(t, res.Failure)
	require.Equal(t, FailureTimeout, res.Failure.Kind, "%v", res.Failure)
	assert.GreaterOrEqual(t, f.p.Stats().CallbackTime-after.CallbackTime, 150*time.Millisecond,
		"the runaway callback's time is counted")
}
