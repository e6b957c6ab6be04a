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
	native := mustStart(b, "", productpage, productpageNodeID, outbound)
	w := wasmtest.NewBench(b, ".", host.PluginConfig{Name: "stats"},
		map[string]any{"node": nodeProperty(productpage, productpageNodeID), "listener_direction": int64(outbound)},
		wasmtest.Exchange{
			Request:  x.reqHeaders,
			Response: append([][2]string{{":status", "200"}}, x.respHeaders[1:]...),
			// request.duration as the native side's (and as Envoy has it at the log phase), so
			// both take the same path: the duration read, not the guest's clock.
			Info: host.StreamInfo{Protocol: "HTTP/1.1", ClusterName: "outbound|9080||ratings.prod.svc.cluster.local",
				Duration: 30 * time.Millisecond,
				Upstream: host.UpstreamInfo{URISanPeerCertificate: ratingsSAN, URISanLocalCertificate: productpageSAN}},
		})
	wasmtest.Compare(b, w, func() { native.do(x) })

	var total int64
	for _, m := range w.Plugin.Metrics().Snapshot() {
		if m.Type == host.MetricCounter {
			total += m.Value
		}
	}
	if want := int64(b.N) + 1; total != want { // +1: the warm-up request
		b.Fatalf("istio_requests_total counted %d, want %d", total, want)
	}
}
