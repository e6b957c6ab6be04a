//go:build !wasip1

package main

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/host"
)

var benchRequest = [][2]string{{":method", "GET"}, {":path", "/products/42"}, {":authority", "shop.example"},
	{":scheme", "http"}, {"user-agent", "bench"}, {"accept", "*/*"}}

// native is the example filter's logic as a plain Go function on the host's header maps:
// count, check the path, set the response header.
func native(cfg config, requests *atomic.Int64, req, resp *host.Headers) bool {
	requests.Add(1)
	path, _ := req.Get(":path")
	if cfg.denied(path) {
		return false
	}
	for _, kv := range cfg.responseHeaders() {
		resp.Set(kv[0], kv[1])
	}
	return true
}

// BenchmarkHeadersOnlyRequest runs a headers-only request through the example filter in
// wazero and through the same logic as native Go, in the same run.
func BenchmarkHeadersOnlyRequest(b *testing.B) {
	cfg, err := parseConfig([]byte(fullConfig))
	require.NoError(b, err)
	var requests atomic.Int64
	w := wasmtest.NewBench(b, ".", host.PluginConfig{Name: "example", Configuration: []byte(fullConfig)}, nil,
		wasmtest.Exchange{Request: benchRequest, Response: [][2]string{{":status", "200"}}})
	if v, _ := w.Do().Get("x-wasmesh-example"); v != "hello" {
		b.Fatalf("response header not set: %q", v)
	}
	b.ReportAllocs()
	wasmtest.Compare(b, w, func() {
		req, resp := host.NewHeaders(benchRequest...), host.NewHeaders([2]string{":status", "200"})
		if !native(cfg, &requests, req, resp) {
			b.Fatal("denied")
		}
	})
	if m, _ := w.Plugin.Metrics().Get(defaultCounter, host.MetricCounter); m.Value != int64(b.N)+2 {
		b.Fatalf("counter %d, want %d (+2 warm-up)", m.Value, b.N+2)
	}
}

// BenchmarkNewInstance is the time to start one VM instance of the example filter
// (instantiate, _initialize, root context, vm start, configure) from the compiled module,
// and the instance's linear memory right after start; the module is compiled once.
func BenchmarkNewInstance(b *testing.B) {
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.RuntimeConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	defer rt.Close(ctx)
	mod, err := rt.Compile(ctx, wasmtest.Bytes(b, "."))
	require.NoError(b, err)
	env := host.Environment{Logger: slog.New(slog.DiscardHandler)}
	var mem uint64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, err := rt.NewPlugin(ctx, mod, host.PluginConfig{Name: "example", Configuration: []byte(fullConfig)}, env)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		mem = p.MemoryBytes()[0]
		_ = p.Close(ctx)
		b.StartTimer()
	}
	b.ReportMetric(float64(mem)/(1<<20), "MiB/instance")
	b.ReportMetric(float64(rt.Compilations()), "compilations")
	if rt.Compilations() != 1 {
		b.Fatalf("module compiled %d times", rt.Compilations())
	}
}
