//go:build !wasip1

// These tests run the filter as Envoy would: compiled to a wasip1 reactor, loaded by the
// proxy-wasm host on wazero, driven through whole requests by the offline harness and by
// the filtertest scenarios in testdata.

package main

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

func exampleHarness(tb testing.TB, cfg string, instances int) *harness.Harness {
	tb.Helper()
	return wasmtest.Harness(tb, ".", harness.Options{Plugin: host.PluginConfig{
		Name: "example", Configuration: []byte(cfg), Instances: instances}})
}

func TestWasmRequestLifecycle(t *testing.T) {
	h := exampleHarness(t, fullConfig, 1)
	ctx := context.Background()

	rep, err := h.Do(ctx, harness.Request{Path: "/hello", Body: [][]byte{[]byte("a"), []byte("b")},
		Response: harness.Response{Status: 200, Headers: [][2]string{{"x-wasmesh-example", "upstream"}}}})
	require.NoError(t, err)
	require.NotNil(t, rep.Upstream)
	assert.Equal(t, "ab", string(rep.Upstream.Body))
	assert.Equal(t, 200, rep.Status)
	assert.Equal(t, "hello", rep.Client.Header("x-wasmesh-example"))
	assert.Nil(t, rep.LocalResponse)

	rep, err = h.Do(ctx, harness.Request{Path: "/admin/x"})
	require.NoError(t, err)
	assert.Nil(t, rep.Upstream, "a denied request never reaches the upstream")
	require.NotNil(t, rep.LocalResponse)
	assert.Equal(t, 403, rep.Status)
	assert.Equal(t, "hello", rep.Client.Header("x-wasmesh-example"), "the local reply passes the response callbacks")
	ph, ok := rep.Phase(harness.PhaseRequestHeaders)
	require.True(t, ok)
	assert.Equal(t, host.Pause, ph.Action)

	m, ok := h.Metric("wasmesh_example_requests_total")
	require.True(t, ok)
	assert.Equal(t, int64(2), m.Value)
}

// Requests on several workers run in parallel on separate instances and every one is
// counted in the shared metric, as Envoy aggregates a metric across workers.
func TestWasmConcurrentWorkers(t *testing.T) {
	h := exampleHarness(t, fullConfig, 2)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				rep, err := h.Do(context.Background(), harness.Request{Path: "/x", Worker: w, PinWorker: true})
				if err == nil && rep.Status != 200 {
					err = assert.AnError
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	m, _ := h.Metric("wasmesh_example_requests_total")
	assert.Equal(t, int64(200), m.Value)
	assert.Empty(t, h.Stats().Failures)
}

func TestWasmBadConfigRefusesToStart(t *testing.T) {
	b := wasmtest.Bytes(t, ".")
	_, err := harness.New(context.Background(), harness.Options{Wasm: b,
		Plugin: host.PluginConfig{Name: "example", Configuration: []byte(`{"deny_path_prefx":"/a"}`)}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "example")
}

// The scenarios users would run with bin/filtertest pass against the freshly built module.
func TestWasmScenarios(t *testing.T) { wasmtest.Scenarios(t, ".") }
