//go:build !wasip1

// These tests drive the filter through the SDK's proxytest emulator, which only the
// forwarding (non-wasip1) build of the proxywasm package talks to.

package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/emulator"
)

var update = flag.Bool("update", false, "rewrite testdata/*/output.golden")

func start(t *testing.T, cfg string) (proxytest.HostEmulator, types.OnPluginStartStatus) {
	t.Helper()
	opt := proxytest.NewEmulatorOption().WithVMContext(&vmContext{}).WithPluginConfiguration([]byte(cfg))
	host := emulator.Start(t, opt)
	return host, host.StartPlugin()
}

const fullConfig = `{
	"response_header": {"name": "x-wasmesh-example", "value": "hello"},
	"deny_path_prefix": "/admin",
	"counter": "wasmesh_example_requests_total"
}`

func TestSetsResponseHeader(t *testing.T) {
	host, status := start(t, fullConfig)
	require.Equal(t, types.OnPluginStartStatusOK, status)

	id := host.InitializeHttpContext()
	assert.Equal(t, types.ActionContinue, host.CallOnRequestHeaders(id, [][2]string{{":path", "/hello"}}, true))
	assert.Equal(t, types.ActionContinue, host.CallOnResponseHeaders(id,
		[][2]string{{":status", "200"}, {"x-wasmesh-example", "from-upstream"}}, false))
	assert.Equal(t, [][2]string{{":status", "200"}, {"x-wasmesh-example", "hello"}},
		host.GetCurrentResponseHeaders(id), "set once, replacing the upstream value")
	assert.Nil(t, host.GetSentLocalResponse(id))
}

func TestCountsEveryRequest(t *testing.T) {
	host, status := start(t, fullConfig)
	require.Equal(t, types.OnPluginStartStatusOK, status)
	for _, path := range []string{"/a", "/admin", "/b"} {
		host.CallOnRequestHeaders(host.InitializeHttpContext(), [][2]string{{":path", path}}, true)
	}
	n, err := host.GetCounterMetric("wasmesh_example_requests_total")
	require.NoError(t, err)
	assert.Equal(t, uint64(3), n, "denied requests are counted too")
}

func TestDeniesPathPrefixWith403(t *testing.T) {
	host, status := start(t, fullConfig)
	require.Equal(t, types.OnPluginStartStatusOK, status)

	id := host.InitializeHttpContext()
	assert.Equal(t, types.ActionPause, host.CallOnRequestHeaders(id, [][2]string{{":path", "/admin/users"}}, true))
	resp := host.GetSentLocalResponse(id)
	require.NotNil(t, resp)
	assert.Equal(t, uint32(403), resp.StatusCode)
	assert.Contains(t, resp.Headers, [2]string{"x-wasmesh-example", "hello"})
	assert.Equal(t, "forbidden by wasmesh example filter\n", string(resp.Data))
	assert.Equal(t, int32(-1), resp.GRPCStatus)
}

func TestRejectsUnknownFieldNamingIt(t *testing.T) {
	host, status := start(t, `{"deny_path_prefx": "/admin"}`)
	assert.Equal(t, types.OnPluginStartStatusFailed, status)
	require.Len(t, host.GetCriticalLogs(), 1)
	assert.Contains(t, host.GetCriticalLogs()[0], `deny_path_prefx: unknown field`)
}

// probes are the requests every golden case replays, in order.
var probes = []string{"/", "/admin", "/admin/users", "/administrator", "/public/admin"}

// TestGolden records, for each testdata/<case>/input.json plugin configuration (the
// *.yaml files beside them are filtertest scenarios), what the
// filter does: whether it starts, what it logs, and what each probe request gets. Only a
// case named error-* may fail to start or log an error, and it must: that is checked
// before -update writes anything, so a good configuration that starts failing fails its
// case instead of becoming its golden.
func TestGolden(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("testdata", "*", "input.json"))
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	for _, input := range dirs {
		dir := filepath.Dir(input)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			input, err := os.ReadFile(filepath.Join(dir, "input.json"))
			require.NoError(t, err)
			got, failed := behaviour(t, string(input))
			if strings.HasPrefix(filepath.Base(dir), "error-") {
				require.True(t, failed, "an error-* case must fail to start or log an error:\n%s", got)
			} else {
				require.False(t, failed, "only error-* cases may fail to start or log an error:\n%s", got)
			}
			golden := filepath.Join(dir, "output.golden")
			if *update {
				require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -update to create it")
			assert.Equal(t, string(want), got)
		})
	}
}

// behaviour describes what the filter does with cfg; failed is whether it refused to start
// or logged an error.
func behaviour(t *testing.T, cfg string) (desc string, failed bool) {
	var b strings.Builder
	host, status := start(t, cfg)
	failed = status != types.OnPluginStartStatusOK || len(host.GetErrorLogs()) > 0 || len(host.GetCriticalLogs()) > 0
	if status != types.OnPluginStartStatusOK {
		b.WriteString("plugin start: failed\n")
	} else {
		b.WriteString("plugin start: ok\n")
		for _, path := range probes {
			id := host.InitializeHttpContext()
			action := host.CallOnRequestHeaders(id, [][2]string{{":method", "GET"}, {":path", path}}, true)
			if resp := host.GetSentLocalResponse(id); resp != nil {
				fmt.Fprintf(&b, "GET %s -> local %d (action %s), headers %s, body %q\n",
					path, resp.StatusCode, actionName(action), pairs(resp.Headers), resp.Data)
				continue
			}
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/plain"}}, false)
			fmt.Fprintf(&b, "GET %s -> upstream (action %s), response headers %s\n",
				path, actionName(action), pairs(host.GetCurrentResponseHeaders(id)))
		}
		for _, name := range []string{defaultCounter, "custom_requests_total"} {
			if n, err := host.GetCounterMetric(name); err == nil {
				fmt.Fprintf(&b, "counter %s = %d\n", name, n)
			}
		}
	}
	for _, l := range host.GetErrorLogs() {
		fmt.Fprintf(&b, "log error: %s\n", l)
	}
	for _, l := range host.GetCriticalLogs() {
		fmt.Fprintf(&b, "log critical: %s\n", l)
	}
	return b.String(), failed
}

func actionName(a types.Action) string {
	if a == types.ActionPause {
		return "pause"
	}
	return "continue"
}

func pairs(ps [][2]string) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, p[0]+"="+p[1])
	}
	return "[" + strings.Join(parts, " ") + "]"
}
