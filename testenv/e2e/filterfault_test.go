package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// trapWasm builds the wasm host's test guest, which traps on a request carrying
// "x-op: trap" and passes every other.
func trapWasm(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "wasm", "host", "testdata", "guests", "kitchen")
	art, err := wasmbuild.Build(context.Background(), dir, wasmbuild.Options{})
	require.NoError(t, err)
	return art.Path
}

func trapPlugin(path, strategy string) string {
	return `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: trapper, namespace: default}
spec:
  selector: {matchLabels: {app: reviews}}
  url: file://` + path + `
  phase: STATS
  failStrategy: ` + strategy + `
`
}

// 9. A filter that traps: with FAIL_OPEN the request passes as if the filter were absent;
// with FAIL_CLOSE only that request fails; either way the proxy keeps serving the rest.
func TestTrappingFilter(t *testing.T) {
	m, _, client := reviewsMesh(t)
	wasm := trapWasm(t)
	send := func(trap bool) int {
		req, _ := http.NewRequest(http.MethodGet, reviewsURL, nil)
		if trap {
			req.Header.Set("x-op", "trap")
		}
		resp, err := client.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}

	require.NoError(t, m.WriteConfig("trap.yaml", trapPlugin(wasm, "FAIL_CLOSE")))
	// In place on every reviews pod (each gets the filter by its own ECDS push): a run of
	// trapping requests, spread over the pods by the load balancer, all fail closed.
	inPlace := func(status int) func() bool {
		return func() bool {
			for i := 0; i < 12; i++ {
				if send(true) != status {
					return false
				}
			}
			return true
		}
	}
	eventually(t, "the filter is in place", inPlace(http.StatusServiceUnavailable))
	for i := 0; i < 20; i++ {
		assert.Equal(t, http.StatusServiceUnavailable, send(true), "a trapping request fails closed")
		assert.Equal(t, http.StatusOK, send(false), "the next request is served")
	}

	require.NoError(t, m.WriteConfig("trap.yaml", trapPlugin(wasm, "FAIL_OPEN")))
	eventually(t, "fail open applies", inPlace(http.StatusOK))
	for i := 0; i < 20; i++ {
		assert.Equal(t, http.StatusOK, send(true), "a trapping request passes, fail open")
		assert.Equal(t, http.StatusOK, send(false))
	}
}
