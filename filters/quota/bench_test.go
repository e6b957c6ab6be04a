//go:build !wasip1

package main

import (
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// A bucket large enough never to run dry: every request takes the allowed path.
const benchConfig = `{"descriptors": [{"name": "per_user",
	"entries": [{"key": "user", "source": "header", "header": "x-user"}],
	"token_bucket": {"max_tokens": 1000000000, "tokens_per_fill": 1000000000, "fill_interval": "1s"}}]}`

// BenchmarkAllowedRequest is the quota filter's added cost per allowed request in wazero,
// beside the same filter code compiled natively and driven by the SDK's proxytest emulator.
func BenchmarkAllowedRequest(b *testing.B) {
	e := start(b, benchConfig)
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if r := e.do(b, "/api", "x-user", "alice"); r.status != 200 {
			b.Fatalf("status %d", r.status)
		}
	}
	nativeNs := float64(time.Since(start).Nanoseconds()) / float64(b.N)

	wasmNs, mib := wasmtest.BenchWasm(b, ".", host.PluginConfig{Name: "quota", Configuration: []byte(benchConfig)}, nil,
		wasmtest.Exchange{
			Request:  [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "reviews:9080"}, {"x-user", "alice"}},
			Response: [][2]string{{":status", "200"}},
		}, b.N, func(_ *host.Headers, p *host.Plugin) {
			if p == nil {
				return
			}
			if m, _ := p.Metrics().Get(requestsMetric("per_user", "allowed"), host.MetricCounter); m.Value != int64(b.N) {
				b.Fatalf("allowed %d, want %d", m.Value, b.N)
			}
		})
	wasmtest.Report(b, wasmNs, nativeNs, mib)
}
