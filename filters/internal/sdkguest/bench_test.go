//go:build !wasip1

package main

import (
	"strconv"
	"testing"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// BenchmarkHostCall is the cost of one SDK call from a standard-Go guest in wazero,
// measured as the difference between requests that make loopCalls of them in one
// callback and requests that make none (best batches, so other processes' load
// disturbs it little): a property read, the same import called directly with a path
// encoded once, a header read, a counter increment, and a 16-byte allocation in the
// guest with no host call at all.
func BenchmarkHostCall(b *testing.B) {
	const loopCalls = 200
	for _, op := range []string{"loop-property", "loop-raw-property", "loop-header", "loop-metric", "loop-alloc"} {
		b.Run(op, func(b *testing.B) {
			exchange := func(n int) wasmtest.Exchange {
				return wasmtest.Exchange{
					Request: [][2]string{{":method", "GET"}, {":path", "/p"}, {":authority", "a"},
						{"x-op", op}, {"x-n", strconv.Itoa(n)}},
					Response: [][2]string{{":status", "200"}},
				}
			}
			with := wasmtest.NewBench(b, ".", host.PluginConfig{Name: "sdk"}, nil, exchange(loopCalls))
			without := wasmtest.NewBench(b, ".", host.PluginConfig{Name: "sdk"}, nil, exchange(0))
			for b.Loop() {
				with.Do()
			}
			requests := max(b.N, 500)
			perCall := (wasmtest.BestBatch(requests, func() { with.Do() }) -
				wasmtest.BestBatch(requests, func() { without.Do() })) / loopCalls
			b.ReportMetric(perCall, "ns/call")
		})
	}
}
