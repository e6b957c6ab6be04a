//go:build !wasip1

package main

import (
	"testing"

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
	native := start(b, benchConfig)
	w := wasmtest.NewBench(b, ".", host.PluginConfig{Name: "quota", Configuration: []byte(benchConfig)}, nil,
		wasmtest.Exchange{
			Request:  [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "reviews:9080"}, {"x-user", "alice"}},
			Response: [][2]string{{":status", "200"}},
		})
	wasmtest.Compare(b, w, func() {
		if r := native.do(b, "/api", "x-user", "alice"); r.status != 200 {
			b.Fatalf("status %d", r.status)
		}
	})
	if m, _ := w.Plugin.Metrics().Get(requestsMetric("per_user", "allowed"), host.MetricCounter); m.Value != int64(b.N)+1 {
		b.Fatalf("allowed %d, want %d (+1 warm-up)", m.Value, b.N+1)
	}
}
