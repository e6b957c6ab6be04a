//go:build !wasip1

// These tests run quota.wasm on the proxy-wasm host in wazero: two VM instances (two
// Envoy workers) share buckets through the host's shared data, time is the harness clock,
// and refills come from ticks.

package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

const perUser = `{"rate_limit_headers": true, "tick_period": "1s", "descriptors": [{"name": "per_user",
	"entries": [{"key": "user", "source": "header", "header": "x-user"}],
	"token_bucket": {"max_tokens": 3, "tokens_per_fill": 3, "fill_interval": "1m"}}]}`

func quotaHarness(t *testing.T, cfg string) *harness.Harness {
	t.Helper()
	return wasmtest.Harness(t, ".", harness.Options{
		Plugin: host.PluginConfig{Name: "quota", Configuration: []byte(cfg), Instances: 2}})
}

func send(t *testing.T, h *harness.Harness, worker int, user string) *harness.Report {
	t.Helper()
	rep, err := h.Do(context.Background(), harness.Request{Path: "/api", Worker: worker, PinWorker: true,
		Headers: [][2]string{{"x-user", user}}})
	require.NoError(t, err)
	require.Empty(t, rep.Failures)
	return rep
}

func TestWasmTwoWorkersShareOneBucket(t *testing.T) {
	h := quotaHarness(t, perUser)
	var got []string
	for i, worker := range []int{0, 1, 0, 1, 0} {
		rep := send(t, h, worker, "alice")
		got = append(got, strconv.Itoa(rep.Status)+":"+rep.Client.Header("x-ratelimit-remaining"))
		if i == 3 {
			assert.Nil(t, rep.Upstream, "a denied request never reaches the upstream")
			assert.Equal(t, "3", rep.Client.Header("x-ratelimit-limit"))
			assert.NotEmpty(t, rep.Client.Header("retry-after"))
			assert.NotEmpty(t, rep.Client.Header("x-ratelimit-reset"))
			assert.NotEmpty(t, rep.Client.Body)
		}
	}
	assert.Equal(t, []string{"200:2", "200:1", "200:0", "429:0", "429:0"}, got)
	assert.Equal(t, 200, send(t, h, 1, "bob").Status, "another user has another bucket")

	allowed, _ := h.Metric(requestsMetric("per_user", "allowed"))
	denied, _ := h.Metric(requestsMetric("per_user", "denied"))
	assert.Equal(t, int64(4), allowed.Value)
	assert.Equal(t, int64(2), denied.Value)

	// A minute later the bucket has been refilled (ticks run meanwhile on both workers).
	h.Advance(time.Minute + time.Second)
	assert.Equal(t, 200, send(t, h, 1, "alice").Status)
	assert.Equal(t, 200, send(t, h, 0, "alice").Status)
}

func TestWasmShadowModeNeverRejects(t *testing.T) {
	h := quotaHarness(t, `{"shadow": true, "descriptors": [{"name": "all",
		"token_bucket": {"max_tokens": 1, "tokens_per_fill": 1, "fill_interval": "1h"}}]}`)
	for i := 0; i < 3; i++ {
		rep := send(t, h, i%2, "alice")
		assert.Equal(t, 200, rep.Status)
		assert.NotNil(t, rep.Upstream)
	}
	shadow, _ := h.Metric(requestsMetric("all", "shadow_denied"))
	assert.Equal(t, int64(2), shadow.Value)
}

func TestWasmBadConfigurationRefusesToStart(t *testing.T) {
	_, err := harness.New(context.Background(), harness.Options{Wasm: wasmtest.Bytes(t, "."),
		Plugin: host.PluginConfig{Name: "quota", Configuration: []byte(
			`{"descriptors": [{"name": "d", "token_bucket": {"max_tokens": -1, "fill_interval": "1s"}}]}`)}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "max_tokens")
}

// The scenario in testdata, which the README shows users running with bin/filtertest.
func TestWasmScenarios(t *testing.T) { wasmtest.Scenarios(t, ".") }
