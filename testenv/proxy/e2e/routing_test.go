package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

func routingBootstrap(a, b, rr1, rr2 *upstream) string {
	return `
node: {id: sidecar~127.0.0.1~t.default~default.svc.cluster.local, cluster: t.default}
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  clusters:` + staticCluster("a", "", addr(a)) + staticCluster("b", "", addr(b)) +
		staticCluster("rr", "", addr(rr1), addr(rr2)) + staticCluster("empty", "") +
		staticCluster("closed", "", "127.0.0.1:1") + `
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    traffic_direction: OUTBOUND
    filter_chains:` + fmt.Sprintf(hcmHeader, "main") + `
          route_config:
            name: main
            request_headers_to_add:
            - header: {key: x-config-level, value: config}
            response_headers_to_add:
            - header: {key: x-resp-config, value: "yes"}
            virtual_hosts:
            - name: other
              domains: ["other.example", "other.example:*"]
              routes:
              - match: {prefix: /}
                direct_response: {status: 201, body: {inline_string: other-vhost}}
            - name: wild
              domains: ["*.wild.example"]
              routes:
              - match: {prefix: /}
                direct_response: {status: 202, body: {inline_string: wildcard-vhost}}
            - name: main
              domains: ["*"]
              request_headers_to_remove: [x-drop-me]
              routes:
              - match: {prefix: /a/}
                route: {cluster: a, prefix_rewrite: /rewritten/, host_rewrite_literal: a.internal}
                request_headers_to_add:
                - header: {key: x-route-added, value: "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"}
                response_headers_to_add:
                - header: {key: x-resp-route, value: added}
                response_headers_to_remove: [x-seen-path]
              - match: {path: /exact}
                direct_response: {status: 200, body: {inline_string: exact-direct}}
              - match: {safe_regex: {regex: "^/re/[0-9]+$"}}
                route: {cluster: b}
              - match:
                  prefix: /hdr
                  headers: [{name: x-pick, string_match: {exact: b}}]
                route: {cluster: b}
              - match:
                  prefix: /hdr
                route: {cluster: a}
              - match:
                  prefix: /q
                  query_parameters: [{name: target, string_match: {exact: b}}]
                route: {cluster: b}
              - match: {prefix: /w}
                route:
                  weighted_clusters:
                    clusters: [{name: a, weight: 1}, {name: b, weight: 3}]
                    header_name: x-split
              - match: {prefix: /old}
                redirect: {path_redirect: /new, response_code: FOUND}
              - match: {prefix: /rr}
                route: {cluster: rr}
              - match: {prefix: /uh}
                route: {cluster: empty}
              - match: {prefix: /uf}
                route: {cluster: closed}
              - match: {prefix: /nc}
                route: {cluster: missing}
              - match: {prefix: /slow}
                route: {cluster: a, timeout: 0.2s}
` + routerFilter + "\n"
}

func TestRouting(t *testing.T) {
	a := newUpstream(t, "a", false, nil)
	b := newUpstream(t, "b", false, nil)
	rr1 := newUpstream(t, "rr1", false, nil)
	rr2 := newUpstream(t, "rr2", false, nil)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: routingBootstrap(a, b, rr1, rr2)})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	t.Run("prefix rewrite, host rewrite and header manipulation", func(t *testing.T) {
		r := do(t, c, "GET", base+"/a/x?y=1", "", map[string]string{"x-drop-me": "1"})
		require.Equal(t, 200, r.code)
		assert.Equal(t, "a", r.header.Get("x-upstream"))
		assert.Empty(t, r.header.Get("x-seen-path"), "route removed the response header")
		assert.Equal(t, "a.internal", r.header.Get("x-seen-host"))
		assert.Equal(t, "127.0.0.1", r.header.Get("x-seen-h-X-Route-Added"))
		assert.Equal(t, "config", r.header.Get("x-seen-h-X-Config-Level"))
		assert.Empty(t, r.header.Get("x-seen-h-X-Drop-Me"))
		assert.Equal(t, "/a/x?y=1", r.header.Get("x-seen-h-X-Envoy-Original-Path"))
		assert.Equal(t, "added", r.header.Get("x-resp-route"))
		assert.Equal(t, "yes", r.header.Get("x-resp-config"))
		assert.NotEmpty(t, r.header.Get("x-envoy-upstream-service-time"))
		assert.NotEmpty(t, r.header.Get("x-seen-h-X-Request-Id"))
		assert.Equal(t, "envoy", r.header.Get("server"))
	})
	t.Run("path rewrite reaches the upstream", func(t *testing.T) {
		// The upstream echoes the path it saw before the route removes x-seen-path, so
		// check through a route that keeps it.
		r := do(t, c, "GET", base+"/re/42", "", nil)
		assert.Equal(t, "b", r.header.Get("x-upstream"))
		assert.Equal(t, "/re/42", r.header.Get("x-seen-path"))
		assert.Equal(t, 404, do(t, c, "GET", base+"/re/abc", "", nil).code)
	})
	t.Run("exact path and direct response", func(t *testing.T) {
		r := do(t, c, "GET", base+"/exact", "", nil)
		assert.Equal(t, 200, r.code)
		assert.Equal(t, "exact-direct", r.body)
		assert.Equal(t, 404, do(t, c, "GET", base+"/exactly", "", nil).code)
	})
	t.Run("virtual hosts by domain", func(t *testing.T) {
		assert.Equal(t, "other-vhost", do(t, c, "GET", base+"/", "other.example", nil).body)
		assert.Equal(t, "other-vhost", do(t, c, "GET", base+"/", "other.example:8080", nil).body)
		assert.Equal(t, "wildcard-vhost", do(t, c, "GET", base+"/", "x.wild.example", nil).body)
	})
	t.Run("header and query matches", func(t *testing.T) {
		assert.Equal(t, "b", do(t, c, "GET", base+"/hdr", "", map[string]string{"x-pick": "b"}).header.Get("x-upstream"))
		assert.Equal(t, "a", do(t, c, "GET", base+"/hdr", "", nil).header.Get("x-upstream"))
		assert.Equal(t, "b", do(t, c, "GET", base+"/q?target=b", "", nil).header.Get("x-upstream"))
	})
	t.Run("weighted clusters split by weight", func(t *testing.T) {
		// Envoy picks by a random value per request modulo the total weight: the split is
		// statistical. 400 requests at 1:3 put a's share 25% +- 2.2% (one standard
		// deviation); the bounds are five.
		counts := map[string]int{}
		for i := 0; i < 400; i++ {
			counts[do(t, c, "GET", base+"/w", "", nil).header.Get("x-upstream")]++
		}
		assert.Equal(t, 400, counts["a"]+counts["b"], "only a and b are targets: %v", counts)
		assert.InDelta(t, 100, counts["a"], 45, "a gets a quarter: %v", counts)
	})
	t.Run("weighted clusters pick by the header_name value", func(t *testing.T) {
		// header_name supplies the random value: value % 4 < 1 picks a, otherwise b.
		for v, want := range map[string]string{"0": "a", "4": "a", "1": "b", "3": "b", "7": "b", "8": "a"} {
			got := do(t, c, "GET", base+"/w", "", map[string]string{"x-split": v}).header.Get("x-upstream")
			assert.Equal(t, want, got, "x-split: %s", v)
		}
	})
	t.Run("round robin over endpoints", func(t *testing.T) {
		counts := map[string]int{}
		for i := 0; i < 20; i++ {
			counts[do(t, c, "GET", base+"/rr", "", nil).header.Get("x-upstream")]++
		}
		assert.Equal(t, map[string]int{"rr1": 10, "rr2": 10}, counts)
	})
	t.Run("redirect", func(t *testing.T) {
		r := do(t, c, "GET", base+"/old?q=1", "svc.example", nil)
		assert.Equal(t, http.StatusFound, r.code)
		assert.Equal(t, "http://svc.example/new?q=1", r.header.Get("Location"))
	})
	t.Run("response flags", func(t *testing.T) {
		r := do(t, c, "GET", base+"/uh", "", nil)
		assert.Equal(t, 503, r.code)
		assert.Equal(t, "no healthy upstream", r.body)
		r = do(t, c, "GET", base+"/uf", "", nil)
		assert.Equal(t, 503, r.code)
		assert.Contains(t, r.body, "connection failure")
		assert.Equal(t, 503, do(t, c, "GET", base+"/nc", "", nil).code)
		assert.Equal(t, 404, do(t, c, "GET", base+"/none", "nomatch.example", nil).code)
		p.Eventually(5*time.Second, "access log lines", func() bool {
			out := p.Stdout()
			return strings.Contains(out, `"GET /uh HTTP/1.1" 503 UH`) && strings.Contains(out, `"GET /uf HTTP/1.1" 503 UF`) &&
				strings.Contains(out, `"GET /nc HTTP/1.1" 503 NC`) && strings.Contains(out, `"GET /none HTTP/1.1" 404 NR`)
		})
	})
	t.Run("stats", func(t *testing.T) {
		assert.GreaterOrEqual(t, p.Stat("cluster.a.upstream_rq_total"), int64(1))
		assert.GreaterOrEqual(t, p.Stat("cluster.a.upstream_rq_2xx"), int64(1))
		assert.Equal(t, int64(2), p.Stat("cluster.rr.membership_healthy"))
		assert.Equal(t, int64(2), p.Stat("cluster.rr.membership_total"))
		assert.GreaterOrEqual(t, p.Stat("cluster.closed.upstream_cx_connect_fail"), int64(1))
		assert.GreaterOrEqual(t, p.Stat("http.main.downstream_rq_5xx"), int64(3))
		assert.GreaterOrEqual(t, p.Stat("http.main.no_route"), int64(1))
		assert.GreaterOrEqual(t, p.Stat("http.main.downstream_cx_active"), int64(1), "the test client keeps a connection open")
	})
}

func TestRouteTimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	slow := newUpstream(t, "slow", false, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	other := newUpstream(t, "other", false, nil)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: routingBootstrap(slow, other, other, other)})
	r := do(t, client(t), "GET", "http://"+p.ListenerAddr("main")+"/slow", "", nil)
	assert.Equal(t, http.StatusGatewayTimeout, r.code)
	assert.Equal(t, "upstream request timeout", r.body)
	p.Eventually(5*time.Second, "UT in the access log", func() bool {
		return strings.Contains(p.Stdout(), `"GET /slow HTTP/1.1" 504 UT`)
	})
	assert.Equal(t, int64(1), p.Stat("cluster.a.upstream_rq_timeout"))
}

func TestH2CAndTrailers(t *testing.T) {
	up := newUpstream(t, "grpcish", true, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-seen-proto", r.Proto)
		w.Header().Set("Trailer", "grpc-status")
		w.Header().Set("content-type", "application/grpc")
		_, _ = w.Write([]byte("payload"))
		w.Header().Set("grpc-status", "0")
	})
	boot := `
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  clusters:` + staticCluster("grpc", `
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}`, addr(up)) + `
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:` + fmt.Sprintf(hcmHeader, "grpc") + `
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{match: {prefix: /}, route: {cluster: grpc, timeout: 0s}}]
` + routerFilter + "\n"
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	resp, err := h2cClient(t).Get("http://" + p.ListenerAddr("main") + "/svc/Method")
	require.NoError(t, err)
	defer resp.Body.Close()
	body := make([]byte, 100)
	n, _ := resp.Body.Read(body)
	for {
		if _, err := resp.Body.Read(body[n:]); err != nil {
			break
		}
	}
	assert.Equal(t, 2, resp.ProtoMajor, "downstream is HTTP/2")
	assert.Equal(t, "HTTP/2.0", resp.Header.Get("x-seen-proto"), "upstream is HTTP/2")
	assert.Equal(t, "payload", string(body[:n]))
	assert.Equal(t, "0", resp.Trailer.Get("grpc-status"))
	assert.Equal(t, int64(1), p.Stat("http.grpc.downstream_rq_http2_total"))
	assert.Equal(t, int64(1), p.Stat("cluster.grpc.upstream_cx_http2_total"))
}
