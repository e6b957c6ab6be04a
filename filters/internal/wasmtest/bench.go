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

// BenchWasm sends n headers-only exchanges through one instance of the filter in dir on a
// fresh runtime and returns the wall time per exchange and the instance's linear memory
// afterwards, in MiB. check, if set, sees the response headers of the first exchange and
// the plugin after the last.
func BenchWasm(b *testing.B, dir string, cfg host.PluginConfig, props map[string]any, x Exchange, n int,
	check func(first *host.Headers, p *host.Plugin)) (nsPerReq, mib float64) {
	b.Helper()
	ctx := context.Background()
	rt, err := host.NewRuntime(ctx, host.RuntimeConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	defer rt.Close(ctx)
	mod, err := rt.Compile(ctx, Bytes(b, dir))
	require.NoError(b, err)
	p, err := rt.NewPlugin(ctx, mod, cfg, host.Environment{Logger: slog.New(slog.DiscardHandler), Properties: props})
	require.NoError(b, err)
	defer p.Close(ctx)
	start := time.Now()
	for i := 0; i < n; i++ {
		s, err := p.NewHTTPStream(ctx, host.StreamOptions{Info: x.Info})
		if err != nil {
			b.Fatal(err)
		}
		s.OnRequestHeaders(ctx, host.NewHeaders(x.Request...), true)
		resp := host.NewHeaders(x.Response...)
		s.OnResponseHeaders(ctx, resp, true)
		s.Finish(ctx)
		if i == 0 && check != nil {
			check(resp, nil)
		}
	}
	nsPerReq = float64(time.Since(start).Nanoseconds()) / float64(max(n, 1))
	if check != nil {
		check(nil, p)
	}
	if st := p.Stats(); len(st.Failures) > 0 {
		b.Fatalf("guest failures: %v", st.Failures)
	}
	return nsPerReq, float64(p.MemoryBytes()[0]) / (1 << 20)
}

// Report writes the side-by-side figures of a filter benchmark.
func Report(b *testing.B, wasmNs, nativeNs, mib float64) {
	b.ReportMetric(wasmNs, "wasm-ns/req")
	b.ReportMetric(nativeNs, "native-ns/req")
	b.ReportMetric(wasmNs/nativeNs, "wasm/native")
	b.ReportMetric(wasmNs-nativeNs, "added-ns/req")
	b.ReportMetric(mib, "MiB/instance")
}
