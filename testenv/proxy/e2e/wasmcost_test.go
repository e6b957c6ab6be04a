package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// What a Wasm filter costs the proxy is in its stats: wasm.<plugin>.callbacks, the calls
// into the guest (a request takes at least four: context, headers, response, end), and
// wasm.<plugin>.callback_time, the time they took in microseconds.
func TestWasmCallbackCostInStats(t *testing.T) {
	kitchen := kitchenWasm(t)
	up := newUpstream(t, "up", false, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	listeners := listenerYAML("main", "", routeYAML("/", `{cluster: up}`), httpFilters(wasmFilterYAML("costly", kitchen, "")))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("up", "", addr(up)), listeners)})
	const requests = 5
	for range requests {
		r := doBody(t, client(t), "GET", "http://"+p.ListenerAddr("main")+"/", nil, nil)
		require.Equal(t, 200, r.code, r.body)
	}
	p.Eventually(10*time.Second, "the requests' callbacks counted", func() bool {
		return p.Stat("wasm.costly.callbacks") >= 4*requests
	})
	assert.Positive(t, p.Stat("wasm.costly.callback_time"), "their time")
}
