package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// toUpListener is a listener that routes everything to the cluster "up"; extra goes
// before its filter chains (listener filters).
func toUpListener(name, dir, extra string) string {
	return `
  - name: ` + name + `
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    traffic_direction: ` + dir + extra + `
    filter_chains:` + fmt.Sprintf(hcmHeader, name) + `
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{match: {prefix: /}, route: {cluster: up}}]
` + routerFilter
}

func twoListenerBootstrap(up *upstream) string {
	l := func(name, dir string) string { return toUpListener(name, dir, "") }
	return `
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
stats_config:
  stats_tags:
  - {tag_name: fixed_tag, fixed_value: here}
static_resources:
  clusters:` + staticCluster("up", "", addr(up)) + `
  listeners:` + l("inbound", "INBOUND") + l("outbound", "OUTBOUND") + "\n"
}

func TestAdminAPI(t *testing.T) {
	up := newUpstream(t, "up", false, nil)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: twoListenerBootstrap(up),
		Args: []string{"--service-node", "node-from-flag", "--service-cluster", "cluster-from-flag"}})
	c := client(t)
	assert.Equal(t, 200, do(t, c, "GET", "http://"+p.ListenerAddr("inbound")+"/", "", nil).code)

	code, body := p.Get("/ready")
	assert.Equal(t, 200, code)
	assert.Equal(t, "LIVE\n", body)

	_, body = p.Get("/server_info")
	var info struct {
		State string `json:"state"`
		Node  struct {
			ID      string `json:"id"`
			Cluster string `json:"cluster"`
		} `json:"node"`
		Opts map[string]any `json:"command_line_options"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &info), body)
	assert.Equal(t, "LIVE", info.State)
	assert.Equal(t, "node-from-flag", info.Node.ID)
	assert.Equal(t, "cluster-from-flag", info.Node.Cluster)

	_, body = p.Get("/clusters")
	assert.Contains(t, body, "up::"+addr(up)+"::health_flags::healthy")
	_, body = p.Get("/listeners")
	assert.Contains(t, body, "inbound::127.0.0.1:")

	_, body = p.Get("/stats?usedonly&filter=downstream_cx_active")
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		assert.Contains(t, line, "downstream_cx_active", "filter applies")
	}
	assert.Contains(t, body, "http.inbound.downstream_cx_active: 1")
	_, body = p.Get("/stats")
	assert.Contains(t, body, "cluster.up.upstream_rq_time: P0(")
	_, body = p.Get("/stats/prometheus")
	assert.Contains(t, body, `envoy_cluster_upstream_rq{envoy_response_code="200",envoy_cluster_name="up",fixed_tag="here"} 1`)
	assert.Contains(t, body, `envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name="up",fixed_tag="here",le="3.6e+06"} 1`)

	_, body = p.Get("/config_dump")
	assert.Contains(t, body, "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump")
	assert.Contains(t, body, "static_listeners")

	code, _ = p.Get("/healthcheck/fail")
	assert.Equal(t, http.StatusMethodNotAllowed, code, "mutations need POST")
	code, _ = p.Post("/healthcheck/fail")
	assert.Equal(t, 200, code)
	code, body = p.Get("/ready")
	assert.Equal(t, 503, code)
	assert.Equal(t, "DRAINING\n", body)
	p.Post("/healthcheck/ok")
	code, _ = p.Get("/ready")
	assert.Equal(t, 200, code)

	code, body = p.Post("/logging?upstream=debug")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, "  upstream: debug")
	code, _ = p.Post("/logging?nosuch=debug")
	assert.Equal(t, 404, code)

	code, body = p.Post("/quitquitquit")
	assert.Equal(t, 200, code)
	assert.Equal(t, "OK\n", body)
	require.True(t, p.Wait(10*time.Second), "quitquitquit stops the process")
}

func TestValidateMode(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	up := newUpstream(t, "up", false, nil)
	require.NoError(t, os.WriteFile(good, []byte(twoListenerBootstrap(up)), 0o644))
	out, err := exec.Command(proxytest.Binary(t), "--mode", "validate", "-c", good).CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "OK")

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("static_resources: {clusterz: []}\n"), 0o644))
	out, err = exec.Command(proxytest.Binary(t), "--mode", "validate", "-c", bad).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "clusterz", "the unknown field is named")
	assert.Contains(t, string(out), bad)
}

// h2GoAway opens a raw HTTP/2 connection, sends one GET and reports whether the server
// sent GOAWAY before the connection ended.
func h2GoAway(t *testing.T, address string) (status string, goAway bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", address, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	fr := http2.NewFramer(conn, conn)
	require.NoError(t, fr.WriteSettings())
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {":authority", "x"}} {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}))
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":status" {
			status = f.Value
		}
	})
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return status, goAway
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			_, _ = dec.Write(f.HeaderBlockFragment())
		case *http2.GoAwayFrame:
			goAway = true
		case *http2.PingFrame:
			_ = fr.WritePing(true, f.Data)
		}
		if goAway && status != "" {
			return status, goAway
		}
	}
}

func TestDrainListenersInboundGraceful(t *testing.T) {
	up := newUpstream(t, "up", false, nil)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: twoListenerBootstrap(up),
		Args: []string{"--drain-strategy", "immediate", "--drain-time-s", "3"}})
	in, out := p.ListenerAddr("inbound"), p.ListenerAddr("outbound")
	c := client(t)
	r := do(t, c, "GET", "http://"+in+"/", "", nil)
	require.Equal(t, "", r.header.Get("Connection"))
	_, goAway := h2GoAway(t, in)
	require.False(t, goAway, "no GOAWAY before draining")

	code, _ := p.Post("/drain_listeners?inboundonly&graceful")
	require.Equal(t, 200, code)

	// During the drain window the inbound listener still accepts new connections, and
	// tells each to go away: Connection: close on HTTP/1.1, GOAWAY on HTTP/2.
	fresh := client(t)
	req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://"+in+"/", nil)
	resp, err := fresh.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.True(t, resp.Close, "HTTP/1.1 response carries Connection: close")
	status, goAway := h2GoAway(t, in)
	assert.Equal(t, "200", status)
	assert.True(t, goAway, "HTTP/2 connection gets GOAWAY")
	assert.GreaterOrEqual(t, p.Stat("http.inbound.downstream_cx_drain_close"), int64(2))

	// Outbound listeners are not drained.
	r = do(t, client(t), "GET", "http://"+out+"/", "", nil)
	assert.Equal(t, "", r.header.Get("Connection"))

	// After the drain time the inbound listener closes; the outbound one keeps serving.
	p.Eventually(10*time.Second, "the inbound listener closing", func() bool {
		conn, err := net.DialTimeout("tcp", in, time.Second)
		if err != nil {
			return true
		}
		conn.Close()
		return false
	})
	assert.Equal(t, 200, do(t, client(t), "GET", "http://"+out+"/", "", nil).code)
}

// A client whose connection the proxy accepted before it was told to stop is served, even
// when its request comes after the listener closed: here the connection is still in the
// TLS inspector, waiting for its first bytes, when SIGTERM comes.
func TestShutdownServesConnectionsStillInTheListenerFilters(t *testing.T) {
	up := newUpstream(t, "up", false, func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, "served") })
	listener := toUpListener("inbound", "INBOUND", `
    listener_filters:
    - name: envoy.filters.listener.tls_inspector
      typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}`)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(staticCluster("up", "", addr(up)), listener)})
	in := p.ListenerAddr("inbound")
	conn, err := net.DialTimeout("tcp", in, time.Second)
	require.NoError(t, err)
	defer conn.Close()
	p.Signal(syscall.SIGTERM)
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", in, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	}, time.Second, time.Millisecond, "the listener closing")

	_, err = fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: in\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "the accepted connection gets an answer, not a close")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "200 served", fmt.Sprintf("%d %s", resp.StatusCode, b))
	assert.True(t, p.Wait(10*time.Second), "the proxy exits")
}

// A request in flight on an inbound listener when the proxy is told to stop may still need
// its application's calls out through the sidecar: the outbound listeners keep accepting
// until the inbound connections are done, then close.
func TestShutdownKeepsOutboundForInboundInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(let) // a failed step must not leave the handler waiting
	var outAddr atomic.Value
	noKeepAlive := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	up := newUpstream(t, "up", false, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/call-out" {
			_, _ = fmt.Fprint(w, "called")
			return
		}
		close(entered)
		<-release
		resp, err := noKeepAlive.Get("http://" + outAddr.Load().(string) + "/")
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	})
	p := proxytest.Start(t, proxytest.Options{Bootstrap: twoListenerBootstrap(up)})
	in, out := p.ListenerAddr("inbound"), p.ListenerAddr("outbound")
	outAddr.Store(out)
	refuses := func(addr string) func() bool {
		return func() bool {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return true
			}
			conn.Close()
			return false
		}
	}

	answer := make(chan string, 1)
	go func() {
		resp, err := noKeepAlive.Get("http://" + in + "/call-out")
		if err != nil {
			answer <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	<-entered
	p.Signal(syscall.SIGTERM)
	// The proxy gives its connections a second on SIGTERM: release the request within it.
	require.Eventually(t, refuses(in), time.Second, time.Millisecond, "the inbound listener closing")
	assert.False(t, refuses(out)(), "the outbound listener accepts while an inbound request is in flight")
	let()
	assert.Equal(t, "200 ", <-answer, "the application's call out during the shutdown went through")
	assert.True(t, p.Wait(10*time.Second), "the proxy exits once the inbound request is done")
	assert.True(t, refuses(out)(), "and its outbound listener with it")
}
