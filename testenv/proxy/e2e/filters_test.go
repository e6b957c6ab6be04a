package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

const faultFilterYAML = `
          - name: envoy.filters.http.fault
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault%s`

func httpFilters(filters ...string) string {
	return "\n          http_filters:" + strings.Join(filters, "") + `
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}`
}

func TestFaultFilter(t *testing.T) {
	a := newUpstream(t, "a", false, nil)
	b := newUpstream(t, "b", false, nil)
	big := newUpstream(t, "big", false, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("x"), 16*1024))
	})
	// Listener "main": aborts with 418 requests that carry x-fault: yes and go to cluster a;
	// routes override the filter config with their own.
	mainFault := fmt.Sprintf(faultFilterYAML, `
              abort: {http_status: 418, percentage: {numerator: 100}}
              upstream_cluster: a
              headers: [{name: x-fault, string_match: {exact: "yes"}}]`)
	perRoute := func(cfg string) string {
		return `
                typed_per_filter_config:
                  envoy.filters.http.fault:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
                    ` + cfg
	}
	mainRoutes := routeYAML("/a", `{cluster: a}`) + routeYAML("/b", `{cluster: b}`) +
		routeYAML("/delay", `{cluster: a}`) + perRoute(`delay: {fixed_delay: 0.2s, percentage: {numerator: 100}}`) +
		routeYAML("/slow", `{cluster: a}`) + perRoute(`delay: {fixed_delay: 2s, percentage: {numerator: 100}}
                    max_active_faults: 1`) +
		routeYAML("/half", `{cluster: a}`) + perRoute(`abort: {http_status: 503, percentage: {numerator: 5000, denominator: TEN_THOUSAND}}`) +
		routeYAML("/grpc", `{cluster: a}`) + perRoute(`abort: {grpc_status: 8, percentage: {numerator: 100}}`) +
		routeYAML("/rl", `{cluster: big}`) + perRoute(`response_rate_limit: {fixed_limit: {limit_kbps: 256}, percentage: {numerator: 100}}`)
	hdrFault := fmt.Sprintf(faultFilterYAML, `
              abort: {header_abort: {}, percentage: {numerator: 100}}
              delay: {header_delay: {}, percentage: {numerator: 100}}`)
	boot := bootstrap(staticCluster("a", "", addr(a))+staticCluster("b", "", addr(b))+staticCluster("big", "", addr(big)),
		listenerYAML("main", "", mainRoutes, httpFilters(mainFault))+
			listenerYAML("hdr", "", routeYAML("/", `{cluster: a}`), httpFilters(hdrFault)))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	base := "http://" + p.ListenerAddr("main")
	hbase := "http://" + p.ListenerAddr("hdr")
	c := client(t)

	t.Run("abort by headers and upstream cluster", func(t *testing.T) {
		r := do(t, c, "GET", base+"/a", "", map[string]string{"x-fault": "yes", "x-envoy-downstream-service-cluster": "client"})
		assert.Equal(t, 418, r.code)
		assert.Equal(t, "fault filter abort", r.body)
		assert.Equal(t, 200, do(t, c, "GET", base+"/a", "", nil).code, "headers do not match")
		assert.Equal(t, 200, do(t, c, "GET", base+"/b", "", map[string]string{"x-fault": "yes"}).code, "another cluster")
		assert.Equal(t, int64(1), p.Stat("http.main.fault.aborts_injected"))
		assert.Equal(t, int64(1), p.Stat("http.main.fault.client.aborts_injected"))
		p.Eventually(5*time.Second, "FI in the access log", func() bool {
			return strings.Contains(p.Stdout(), `"GET /a HTTP/1.1" 418 FI`)
		})
	})
	t.Run("per-route delay", func(t *testing.T) {
		r := do(t, c, "GET", base+"/delay", "", map[string]string{"x-fault": "yes"})
		assert.Equal(t, 200, r.code, "the route's config replaces the filter's abort")
		assert.Equal(t, int64(1), p.Stat("http.main.fault.delays_injected"))
		p.Eventually(5*time.Second, "DI in the access log", func() bool {
			return strings.Contains(p.Stdout(), `"GET /delay HTTP/1.1" 200 DI`)
		})
	})
	t.Run("max_active_faults", func(t *testing.T) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client(t).Get(base + "/slow")
			if err == nil {
				_ = resp.Body.Close()
			}
		}()
		p.Eventually(5*time.Second, "a delayed request", func() bool { return p.Stat("http.main.fault.active_faults") == 1 })
		assert.Equal(t, 200, do(t, c, "GET", base+"/slow", "", nil).code)
		assert.Equal(t, int64(1), p.Stat("http.main.fault.faults_overflow"))
		wg.Wait()
		p.Eventually(5*time.Second, "no active fault", func() bool { return p.Stat("http.main.fault.active_faults") == 0 })
	})
	t.Run("abort percentage", func(t *testing.T) {
		aborted := 0
		for i := 0; i < 200; i++ {
			if do(t, c, "GET", base+"/half", "", nil).code == 503 {
				aborted++
			}
		}
		assert.InDelta(t, 100, aborted, 40, "50%% of 200 (sd 7)")
	})
	t.Run("grpc abort", func(t *testing.T) {
		r := do(t, c, "POST", base+"/grpc", "", map[string]string{"content-type": "application/grpc"})
		assert.Equal(t, 200, r.code)
		assert.Equal(t, "8", r.header.Get("grpc-status"))
		assert.Equal(t, "fault filter abort", r.header.Get("grpc-message"))
	})
	t.Run("response rate limit", func(t *testing.T) {
		r := do(t, c, "GET", base+"/rl", "", nil)
		assert.Equal(t, 200, r.code)
		assert.Len(t, r.body, 16*1024, "the body arrives whole")
		assert.Equal(t, int64(1), p.Stat("http.main.fault.response_rl_injected"))
	})
	t.Run("header-controlled faults", func(t *testing.T) {
		assert.Equal(t, 200, do(t, c, "GET", hbase+"/", "", nil).code, "no header, no fault")
		r := do(t, c, "GET", hbase+"/", "", map[string]string{"x-envoy-fault-abort-request": "429"})
		assert.Equal(t, 429, r.code)
		r = do(t, c, "GET", hbase+"/", "", map[string]string{"x-envoy-fault-abort-request": "429", "x-envoy-fault-abort-request-percentage": "0"})
		assert.Equal(t, 200, r.code, "percentage 0 from the header")
		r = do(t, c, "GET", hbase+"/", "", map[string]string{"x-envoy-fault-abort-grpc-request": "14", "content-type": "application/grpc"})
		assert.Equal(t, "14", r.header.Get("grpc-status"))
		r = do(t, c, "GET", hbase+"/", "", map[string]string{"x-envoy-fault-delay-request": "50"})
		assert.Equal(t, 200, r.code)
		assert.Equal(t, int64(1), p.Stat("http.hdr.fault.delays_injected"))
		assert.Equal(t, int64(2), p.Stat("http.hdr.fault.aborts_injected"))
	})
}

const corsFilterYAML = `
          - name: envoy.filters.http.cors
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors}`

func TestCORSFilter(t *testing.T) {
	up := newUpstream(t, "up", false, nil)
	vhostPolicy := `
              typed_per_filter_config:
                envoy.filters.http.cors:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy
                  allow_origin_string_match: [{exact: "https://a.example"}, {suffix: ".b.example"}]
                  allow_methods: "GET,POST"
                  allow_headers: "x-custom"
                  expose_headers: "x-exposed"
                  max_age: "600"
                  allow_credentials: true`
	routes := routeYAML("/route", `{cluster: up}`) + `
                typed_per_filter_config:
                  envoy.filters.http.cors:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy
                    allow_origin_string_match: [{exact: "https://c.example"}]
                    allow_methods: "*"` + routeYAML("/", `{cluster: up}`)
	legacy := `
              cors:
                allow_origin_string_match: [{prefix: "https://legacy"}]
                allow_methods: "PUT"`
	boot := bootstrap(staticCluster("up", "", addr(up)),
		listenerYAML("main", vhostPolicy, routes, httpFilters(corsFilterYAML))+
			listenerYAML("legacy", legacy, routeYAML("/", `{cluster: up}`), httpFilters(corsFilterYAML)))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	preflight := func(url, origin, method string) result {
		return do(t, c, "OPTIONS", url, "", map[string]string{"origin": origin, "access-control-request-method": method,
			"access-control-request-headers": "x-custom"})
	}
	t.Run("preflight from an allowed origin is answered by the proxy", func(t *testing.T) {
		r := preflight(base+"/x", "https://a.example", "POST")
		assert.Equal(t, 200, r.code)
		assert.Empty(t, r.header.Get("x-upstream"), "not forwarded")
		assert.Equal(t, "https://a.example", r.header.Get("access-control-allow-origin"))
		assert.Equal(t, "GET,POST", r.header.Get("access-control-allow-methods"))
		assert.Equal(t, "x-custom", r.header.Get("access-control-allow-headers"))
		assert.Equal(t, "600", r.header.Get("access-control-max-age"))
		assert.Equal(t, "true", r.header.Get("access-control-allow-credentials"))
		r = preflight(base+"/x", "https://www.b.example", "GET")
		assert.Equal(t, "https://www.b.example", r.header.Get("access-control-allow-origin"), "suffix match")
	})
	t.Run("preflight from another origin goes upstream", func(t *testing.T) {
		r := preflight(base+"/x", "https://evil.example", "POST")
		assert.Equal(t, "up", r.header.Get("x-upstream"))
		assert.Empty(t, r.header.Get("access-control-allow-origin"))
	})
	t.Run("simple requests get the allow and expose headers", func(t *testing.T) {
		r := do(t, c, "GET", base+"/x", "", map[string]string{"origin": "https://a.example"})
		assert.Equal(t, "up", r.header.Get("x-upstream"))
		assert.Equal(t, "https://a.example", r.header.Get("access-control-allow-origin"))
		assert.Equal(t, "x-exposed", r.header.Get("access-control-expose-headers"))
		assert.Equal(t, "true", r.header.Get("access-control-allow-credentials"))
		r = do(t, c, "GET", base+"/x", "", map[string]string{"origin": "https://evil.example"})
		assert.Empty(t, r.header.Get("access-control-allow-origin"))
	})
	t.Run("the route's policy comes before the virtual host's", func(t *testing.T) {
		r := preflight(base+"/route", "https://c.example", "DELETE")
		assert.Equal(t, 200, r.code)
		assert.Equal(t, "https://c.example", r.header.Get("access-control-allow-origin"))
		assert.Equal(t, "DELETE", r.header.Get("access-control-allow-methods"), "* echoes the requested method")
		assert.Equal(t, "x-custom", r.header.Get("access-control-allow-headers"), "from the virtual host's policy")
		r = preflight(base+"/route", "https://a.example", "GET")
		assert.Equal(t, "up", r.header.Get("x-upstream"), "the route's origins replace the virtual host's")
	})
	t.Run("legacy cors fields", func(t *testing.T) {
		r := preflight("http://"+p.ListenerAddr("legacy")+"/", "https://legacy.example", "PUT")
		assert.Equal(t, 200, r.code)
		assert.Equal(t, "https://legacy.example", r.header.Get("access-control-allow-origin"))
		assert.Equal(t, "PUT", r.header.Get("access-control-allow-methods"))
	})
	assert.GreaterOrEqual(t, p.Stat("http.main.cors.origin_valid"), int64(4))
	assert.GreaterOrEqual(t, p.Stat("http.main.cors.origin_invalid"), int64(2))
}
