package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
	"github.com/wasmesh/wasmesh/testenv/proxy/server"
)

// The test hooks other rooms' tests drive meshproxy with: counters exposed as a Wasm
// filter's (tags extracted by the bootstrap's rules, no envoy_ prefix), and the admin POSTs
// written to a file in order.
func TestTestHooks(t *testing.T) {
	dir := t.TempDir()
	counters := filepath.Join(dir, "counters")
	require.NoError(t, os.WriteFile(counters, []byte(
		"reporter=.=destination;.;tenant=.=acme;.;istio_requests_total 3\n\nreporter=.=source;.;tenant=.=acme;.;istio_requests_total 5\n"), 0o644))
	posts := filepath.Join(dir, "posts")
	p := proxytest.Start(t, proxytest.Options{
		Bootstrap: `
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
stats_config:
  stats_tags:
  - {tag_name: reporter, regex: "(reporter=\\.=(.*?);\\.;)"}
  - {tag_name: tenant, regex: "(tenant=\\.=(.*?);\\.;)"}
`,
		Env: []string{server.EnvTestWasmCounters + "=" + counters, server.EnvTestAdminPosts + "=" + posts}})

	_, page := p.Get("/stats/prometheus")
	assert.Contains(t, page, "# TYPE istio_requests_total counter\n"+
		`istio_requests_total{reporter="destination",tenant="acme"} 3`+"\n"+
		`istio_requests_total{reporter="source",tenant="acme"} 5`+"\n")
	_, text := p.Get("/stats?filter=istio_requests_total")
	assert.Contains(t, text, "wasmcustom.reporter=.=destination;.;tenant=.=acme;.;istio_requests_total: 3")

	for _, path := range []string{"/healthcheck/fail", "/healthcheck/ok", "/drain_listeners?inboundonly&graceful"} {
		code, _ := p.Post(path)
		require.Equal(t, 200, code, path)
	}
	p.Get("/ready")
	b, err := os.ReadFile(posts)
	require.NoError(t, err)
	assert.Equal(t, "/healthcheck/fail\n/healthcheck/ok\n/drain_listeners?inboundonly&graceful\n", string(b),
		"POSTs only, in order, with their query")

	// A counters file the proxy cannot read is an error at start, naming the hook.
	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("istio_requests_total many\n"), 0o644))
	cmd := exec.Command(proxytest.Binary(t), "--mode", "validate", "--config-yaml", "admin: {}")
	cmd.Env = append(os.Environ(), server.EnvTestWasmCounters+"="+bad)
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), server.EnvTestWasmCounters)
	assert.Contains(t, string(out), "istio_requests_total many")
}
