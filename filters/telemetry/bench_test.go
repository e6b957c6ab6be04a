//go:build !wasip1

package main

import (
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// BenchmarkReporter is one reporter's added cost per request: a headers-only request
// through the client sidecar (reporter=source, the peer's metadata arriving on the
// response) in wazero, beside the same filter code compiled natively and driven by the
// SDK's proxytest emulator (whose own bookkeeping is included in native-ns/req, so the
// ratio understates the Wasm overhead, if anything). Istio measured Wasm stats at 30-50%
// more proxy CPU than the native C++ filter.
func BenchmarkReporter(b *testing.B) {
	x := clientRequest()
	p := mustStart(b, "", productpage, productpageNodeID, outbound)
	start := time.Now()
	for i := 0; i < b.N; i++ {
		p.do(x)
	}
	nativeNs := float64(time.Since(start).Nanoseconds()) / float64(b.N)

	wasmNs, mib := wasmtest.BenchWasm(b, ".", host.PluginConfig{Name: "stats"},
		map[string]any{"node": nodeProperty(productpage, productpageNodeID), "listener_direction": int64(outbound)},
		wasmtest.Exchange{
			Request:  x.reqHeaders,
			Response: append([][2]string{{":status", "200"}}, x.respHeaders[1:]...),
			Info: host.StreamInfo{Protocol: "HTTP/1.1", ClusterName: "outbound|9080||ratings.prod.svc.cluster.local",
				Upstream: host.UpstreamInfo{URISanPeerCertificate: ratingsSAN, URISanLocalCertificate: productpageSAN}},
		}, b.N, func(_ *host.Headers, pl *host.Plugin) {
			if pl == nil {
				return
			}
			var total int64
			for _, m := range pl.Metrics().Snapshot() {
				if m.Type == host.MetricCounter {
					total += m.Value
				}
			}
			if total != int64(b.N) {
				b.Fatalf("istio_requests_total counted %d, want %d", total, b.N)
			}
		})
	wasmtest.Report(b, wasmNs, nativeNs, mib)
}
