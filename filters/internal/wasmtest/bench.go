//go:build !wasip1

package wasmtest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// Exchange is a headers-only request and its response, for benchmarks.
type Exchange struct {
	Request, Response [][2]string
	Info              host.StreamInfo
}

// Bench is one instance of a filter on its own runtime, ready to take exchanges.
type Bench struct {
	tb testing.TB
	// Plugin is the running filter, for checks after the run.
	Plugin *host.Plugin
	x      Exchange
}

// NewBench loads the filter in dir into a fresh runtime with one instance; both are
// closed when tb ends.
func NewBench(tb testing.TB, dir string, cfg host.PluginConfig, props map[string]any, x Exchange) *Bench {
	tb.Helper()
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.RuntimeConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = rt.Close(ctx) })
	mod, err := rt.Compile(ctx, Bytes(tb, dir))
	require.NoError(tb, err)
	p, err := rt.NewPlugin(ctx, mod, cfg, host.Environment{Logger: slog.New(slog.DiscardHandler), Properties: props})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = p.Close(ctx) })
	return &Bench{tb: tb, Plugin: p, x: x}
}

// Do sends one headers-only exchange through the filter and returns the response headers
// as the filter left them.
func (w *Bench) Do() *host.Headers {
	ctx := context.Background()
	s, err := w.Plugin.NewHTTPStream(ctx, host.StreamOptions{Info: w.x.Info})
	if err != nil {
		w.tb.Fatal(err)
	}
	s.OnRequestHeaders(ctx, host.NewHeaders(w.x.Request...), true)
	resp := host.NewHeaders(w.x.Response...)
	s.OnResponseHeaders(ctx, resp, true)
	s.Finish(ctx)
	return resp
}

// MiB is the instance's linear memory.
func (w *Bench) MiB() float64 { return float64(w.Plugin.MemoryBytes()[0]) / (1 << 20) }

// Compare times wasm (one request through the filter in wazero, the benchmark's ns/op)
// and then native (the same logic as native Go) for as many requests, in the same run,
// and reports both side by side with the instance's memory afterwards. Setup is not
// timed: the filter is loaded before and each side sees one warm-up request.
// wasm-cpu-ns/req is the process's CPU time per wasm request (garbage collection
// included), steadier than the wall clock when other processes share the machine.
func Compare(b *testing.B, w *Bench, native func()) {
	b.Helper()
	w.Do()
	native()
	var cpu0 int64
	for b.Loop() {
		if cpu0 == 0 {
			cpu0 = cpuTime()
		}
		w.Do()
	}
	wasmCPU := float64(cpuTime()-cpu0) / float64(b.N)
	wasmNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	n := b.N
	start := time.Now()
	for range n {
		native()
	}
	nativeNs := float64(time.Since(start).Nanoseconds()) / float64(n)
	if st := w.Plugin.Stats(); len(st.Failures) > 0 {
		b.Fatalf("guest failures: %v", st.Failures)
	}
	Report(b, wasmNs, nativeNs, w.MiB())
	if wasmCPU > 0 {
		b.ReportMetric(wasmCPU, "wasm-cpu-ns/req")
	}
}

// Report writes the side-by-side figures of a filter benchmark.
func Report(b *testing.B, wasmNs, nativeNs, mib float64) {
	b.ReportMetric(wasmNs, "wasm-ns/req")
	b.ReportMetric(nativeNs, "native-ns/req")
	b.ReportMetric(wasmNs/nativeNs, "wasm/native")
	b.ReportMetric(wasmNs-nativeNs, "added-ns/req")
	b.ReportMetric(mib, "MiB/instance")
}
