//go:build !wasip1

package main

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// A Counter sees each allocation and each host call a guest makes: a request whose
// callback allocates loopCalls times (or increments a counter loopCalls times, one host
// call each) counts exactly that many more than the same request with none.
func TestCounterSeesEachAllocationAndHostCall(t *testing.T) {
	const loopCalls = 25
	counter := wasmtest.NewCounter(t, ".", host.PluginConfig{Name: "sdk"}, nil)
	count := func(op string, n int) wasmtest.GuestCounts {
		return counter.Count(wasmtest.Exchange{
			Request: [][2]string{{":method", "GET"}, {":path", "/p"}, {":authority", "a"},
				{"x-op", op}, {"x-n", strconv.Itoa(n)}},
			Response: [][2]string{{":status", "200"}},
		}, 5, 20)
	}
	for _, tc := range []struct {
		op                string
		allocs, hostCalls float64
	}{
		{"loop-alloc", loopCalls, 0},
		{"loop-metric", 0, loopCalls},
	} {
		none, with := count(tc.op, 0), count(tc.op, loopCalls)
		assert.Equal(t, tc.allocs, with.Allocs-none.Allocs, "%s: allocations per request", tc.op)
		assert.Equal(t, tc.hostCalls, with.HostCalls-none.HostCalls, "%s: host calls per request", tc.op)
		assert.Greater(t, with.Calls, none.Calls, "%s: guest calls per request", tc.op)
		assert.Positive(t, none.HostCalls, "%s: reading x-op is a host call", tc.op)
	}
}
