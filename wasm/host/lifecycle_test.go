package host

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	wg "github.com/wasmesh/wasmesh/wasm/host/internal/wasmgen"
)

func TestStartupReadsConfigurationAndRootID(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{Name: "k", RootID: "my-root", VMConfig: []byte("vm-conf"),
		Configuration: []byte("a=b")}, Environment{})
	msgs := f.logs.messages()
	assert.Contains(t, msgs, "vm_start config=vm-conf status=0")
	assert.Contains(t, msgs, "configure root_id=my-root status=0 root=1")
	assert.Equal(t, ABI021, f.p.Module().ABIVersion())
	assert.Equal(t, int64(1), f.p.Stats().VMStarts)
}

func TestStartupFailuresNameThePluginAndPhase(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	mod, err := rt.Compile(ctx, guestWasm(t, "kitchen"))
	require.NoError(t, err)
	env := Environment{Logger: slog.New(slog.DiscardHandler)}
	cases := []struct {
		name string
		cfg  PluginConfig
		want string
	}{
		{"vm_start false", PluginConfig{Name: "p1", VMConfig: []byte("fail-start")}, `plugin "p1": on_vm_start returned false`},
		{"configure false", PluginConfig{Name: "p2", Configuration: []byte("fail-configure")}, `plugin "p2": on_configure returned false`},
		{"configure trap", PluginConfig{Name: "p3", Configuration: []byte("trap-configure")}, `plugin "p3": on_configure: trap: wasm error: out of bounds memory access`},
		{"memory limit below module minimum", PluginConfig{Name: "p4", MemoryLimit: 64 << 10}, `plugin "p4": memory limit`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rt.NewPlugin(ctx, mod, tc.cfg, env)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = rt.NewPlugin(ctx, mod, PluginConfig{Name: "p2", Configuration: []byte("fail-configure")}, env)
	var fail *Failure
	require.ErrorAs(t, err, &fail)
	assert.Equal(t, FailureBadReturn, fail.Kind)
}

func TestABIVersionDetection(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	for _, tc := range []struct {
		wasm []byte
		want ABIVersion
	}{
		{guestWasm(t, "kitchen"), ABI021},
		{guestWasm(t, "abi010"), ABI010},
		{commandModule("proxy_abi_version_0_2_0"), ABI020},
	} {
		mod, err := rt.Compile(ctx, tc.wasm)
		require.NoError(t, err)
		assert.Equal(t, tc.want, mod.ABIVersion())
	}
	_, err := rt.Compile(ctx, commandModule("not_a_marker"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "proxy_abi_version")
}

// A command-style module (older TinyGo) is started with _start, which may end in
// proc_exit(0); it may import wasi_unstable (AssemblyScript) and need no stream callbacks:
// missing callbacks continue, as in Envoy.
func TestCommandModuleWithStartAndMissingCallbacks(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	mod, err := rt.Compile(ctx, commandModule("proxy_abi_version_0_2_1"))
	require.NoError(t, err)
	logs := &logRecorder{}
	p, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: "cmd"}, Environment{Logger: slog.New(logs)})
	require.NoError(t, err)
	defer p.Close(ctx)
	rec, ok := logs.find("started via _start")
	require.True(t, ok, "proxy_log from _start: %v", logs.messages())
	assert.Equal(t, "info", rec.Attrs["wasm_level"])
	rec, ok = logs.find("hello stdout")
	require.True(t, ok, "wasi_unstable.fd_write from _start: %v", logs.messages())
	assert.Equal(t, "stdout", rec.Attrs["source"])

	s, err := p.NewHTTPStream(ctx, StreamOptions{})
	require.NoError(t, err)
	for _, res := range []Result{
		s.OnRequestHeaders(ctx, NewHeaders(), false),
		s.OnRequestBody(ctx, []byte("abc"), true),
		s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}), true),
	} {
		assert.Equal(t, Continue, res.Action)
		assert.Nil(t, res.Failure)
	}
	s.Finish(ctx)
	assert.Empty(t, p.Stats().Failures)
}

func TestHostCallsDuringInstantiation(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	mod, err := rt.Compile(ctx, startSectionModule())
	require.NoError(t, err)
	logs := &logRecorder{}
	p, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: "as", RootID: "as-root"}, Environment{Logger: slog.New(logs)})
	require.NoError(t, err)
	defer p.Close(ctx)
	assert.Contains(t, logs.messages(), "as-root")
}

func TestABI010Guest(t *testing.T) {
	ctx := context.Background()
	var calls int
	env := Environment{HTTPCalls: HTTPCallDispatcherFunc(func(_ context.Context, req *HTTPCallRequest, done func(*HTTPCallResponse, error)) error {
		calls++
		done(&HTTPCallResponse{Headers: [][2]string{{":status", "200"}}}, nil)
		return nil
	})}
	f := newFixture(t, "abi010", PluginConfig{VMConfig: []byte("vm"), Configuration: []byte("plugin")}, env)
	assert.Equal(t, ABI010, f.p.Module().ABIVersion())

	sigs := &signals{}
	s, res, h := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, [2]string{"x-op", "call"})
	// The 0.1.0 callback takes no end_of_stream argument; the host adapts the call.
	assert.Equal(t, "0.1.0", hget(h, "x-abi"))
	// proxy_get_configuration reads the VM configuration in on_vm_start and the plugin
	// configuration in on_configure.
	assert.Equal(t, "vm|plugin", hget(h, "x-config"))
	// In 0.1.0 a missing header is an empty value, not NotFound.
	assert.Equal(t, "0:", hget(h, "x-missing-status"))
	// The call was answered right away but delivered after the callback returned; the
	// guest then resumed the request with the 0.1.0 proxy_continue_request.
	assert.Equal(t, Pause, res.Action)
	assert.Equal(t, 1, calls)
	assert.Equal(t, "1", hget(h, "x-called"))
	require.Len(t, sigs.list(), 1)
	assert.Equal(t, Signal{Kind: SignalContinue, Stream: StreamRequest}, sigs.list()[0])

	res = s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}, [2]string{"a", "b"}), true)
	assert.Equal(t, Continue, res.Action)
	assert.Equal(t, "2", hget(s.ResponseHeaders(), "x-abi-response"))
	s.Finish(ctx)

	// proxy_clear_route_cache and proxy_continue_response (0.1.0) act on the stream after
	// the callback, in order.
	s, _, _ = f.headersOnly(t, StreamOptions{})
	res = s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}, [2]string{"x-continue", "1"}), true)
	assert.Equal(t, Pause, res.Action)
	assert.Equal(t, []Signal{{Kind: SignalClearRouteCache, Stream: StreamRequest}, {Kind: SignalContinue, Stream: StreamResponse}}, res.Signals)
	s.Finish(ctx)
}

// A callback whose signature the host cannot call is refused when the module is loaded,
// naming it: a stream callback must return its i32 action. on_vm_start, on_configure and
// on_done may return nothing (then they count as true).
func TestCallbackSignaturesAreCheckedAtLoad(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	module := func(extra ...wg.Func) []byte {
		funcs := []wg.Func{
			{Name: "proxy_abi_version_0_2_1"},
			{Name: "proxy_on_memory_allocate", Params: 1, Results: 1, Body: wg.I32Const(1024)},
		}
		return wg.Module{Funcs: append(funcs, extra...), MemPages: 1, Start: -1}.Encode()
	}
	_, err := rt.Compile(ctx, module(wg.Func{Name: "proxy_on_request_headers", Params: 3}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "export proxy_on_request_headers has signature")
	assert.Contains(t, err.Error(), "want [3 2] i32 params")

	_, err = rt.Compile(ctx, module(wg.Func{Name: "proxy_on_done", Params: 2, Results: 1, Body: wg.I32Const(1)}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "export proxy_on_done has signature")
	assert.Contains(t, err.Error(), "want [1] i32 params")

	_, err = rt.Compile(ctx, module(
		wg.Func{Name: "proxy_on_vm_start", Params: 2},
		wg.Func{Name: "proxy_on_configure", Params: 2},
		wg.Func{Name: "proxy_on_done", Params: 1},
	))
	require.NoError(t, err)
}

// A stream pinned to a worker the plugin does not have is refused, naming the range.
func TestPinnedWorkerOutOfRange(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "kitchen", PluginConfig{Name: "two", Instances: 2}, Environment{})
	for _, w := range []int{-1, 2} {
		_, err := f.p.NewHTTPStream(ctx, StreamOptions{PinWorker: true, Worker: w})
		assert.EqualError(t, err, fmt.Sprintf(`plugin "two": worker %d out of range [0, 2)`, w))
	}
	s, err := f.p.NewHTTPStream(ctx, StreamOptions{PinWorker: true, Worker: 1})
	require.NoError(t, err)
	assert.Equal(t, 1, s.Worker())
	s.Finish(ctx)
}
