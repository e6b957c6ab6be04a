package e2e

import (
	"bufio"
	"fmt"
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// wasmNetworkListener is a TCP listener with envoy.filters.network.wasm running file with
// config before tcp_proxy to the echo cluster.
func wasmNetworkListener(file, config string, failOpen bool) string {
	return `
  - name: db
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    traffic_direction: INBOUND
    filter_chains:
    - filters:
      - name: istio.stats
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm
          config:
            name: tcp_stats
            root_id: tcp_stats
            fail_open: ` + fmt.Sprint(failOpen) + `
            vm_config:
              vm_id: tcp_stats
              runtime: envoy.wasm.runtime.v8
              code: {local: {filename: ` + file + `}}
            configuration:
              "@type": type.googleapis.com/google.protobuf.StringValue
              value: '` + config + `'
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: db
          cluster: echo
`
}

// The telemetry filter as a network filter sees every byte both ways and the connection's
// end, and reports Istio's TCP metrics with the cluster tcp_proxy chose.
func TestWasmNetworkFilterReportsTCPMetrics(t *testing.T) {
	telemetry := wasmFixture(t, "telemetry.wasm")
	up := echoServer(t, "echo")
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("echo", "", up),
		wasmNetworkListener(telemetry, `{"network": true}`, false)) + statsTagsYAML()})

	for i := 0; i < 2; i++ {
		conn, err := net.DialTimeout("tcp", p.ListenerAddr("db"), 5*time.Second)
		require.NoError(t, err)
		require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
		r := bufio.NewReader(conn)
		for _, line := range []string{"hello", "wasm"} { // 6 + 5 bytes out, 11 + 10 back
			_, err = fmt.Fprintln(conn, line)
			require.NoError(t, err)
			got, err := r.ReadString('\n')
			require.NoError(t, err)
			assert.Equal(t, "echo:"+line+"\n", got, "the bytes pass through the filter unchanged")
		}
		require.NoError(t, conn.Close())
	}

	var prom string
	series := func(name string, v int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^%s\{[^}]*reporter="destination"[^}]*request_protocol="tcp"[^}]*\} %d$`, name, v))
	}
	p.Eventually(10*time.Second, "both connections reported at close", func() bool {
		_, prom = p.Get("/stats/prometheus")
		return series("istio_tcp_connections_closed_total", 2).MatchString(prom)
	})
	assert.Regexp(t, series("istio_tcp_connections_opened_total", 2), prom)
	assert.Regexp(t, series("istio_tcp_received_bytes_total", 2*11), prom)
	assert.Regexp(t, series("istio_tcp_sent_bytes_total", 2*21), prom)
	assert.Regexp(t, `(?m)^istio_tcp_sent_bytes_total\{[^}]*source_workload="unknown"`, prom)
	assert.Equal(t, int64(2), p.Stat("cluster.echo.upstream_cx_total"))
}

// A module that traps when a connection starts fails the connection, or lets it through
// untouched when the plugin fails open; either way the proxy keeps serving.
func TestWasmNetworkFilterFailurePolicy(t *testing.T) {
	telemetry := wasmFixture(t, "telemetry.wasm")
	up := echoServer(t, "echo")
	// An HTTP configuration: the Go SDK's plugin then has no TCP context, and the first
	// connection callback traps.
	for _, failOpen := range []bool{false, true} {
		p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("echo", "", up),
			wasmNetworkListener(telemetry, `{}`, failOpen))})
		conn, err := net.DialTimeout("tcp", p.ListenerAddr("db"), 5*time.Second)
		require.NoError(t, err)
		require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
		_, _ = fmt.Fprintln(conn, "hi")
		got, err := bufio.NewReader(conn).ReadString('\n')
		_ = conn.Close()
		if failOpen {
			require.NoError(t, err)
			assert.Equal(t, "echo:hi\n", got, "fail open: the connection goes on without the filter")
		} else {
			assert.Error(t, err, "fail closed: the connection is closed")
			assert.Equal(t, int64(0), p.Stat("cluster.echo.upstream_cx_total"))
		}
		assert.Equal(t, int64(1), p.Stat("wasm.tcp_stats.failed_connections"), "fail open %v", failOpen)
	}
}
