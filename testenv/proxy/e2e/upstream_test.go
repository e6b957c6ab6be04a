package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// endpointYAML is one lb_endpoints entry.
func endpointYAML(a, health string) string {
	h, p, _ := net.SplitHostPort(a)
	hs := ""
	if health != "" {
		hs = "\n            health_status: " + health
	}
	return fmt.Sprintf("\n          - endpoint: {address: {socket_address: {address: %s, port_value: %s}}}%s", h, p, hs)
}

// localityYAML is one LocalityLbEndpoints entry; extra holds its other fields, one per
// line.
func localityYAML(extra string, eps ...string) string {
	fields := ""
	for _, f := range strings.Split(strings.TrimSpace(extra), "\n") {
		if f = strings.TrimSpace(f); f != "" {
			fields += f + "\n          "
		}
	}
	return "\n        - " + fields + "lb_endpoints:" + strings.Join(eps, "")
}

func clusterYAML(name, extra, assignmentExtra string, localities ...string) string {
	return fmt.Sprintf(`
  - name: %q
    type: STATIC
    connect_timeout: 1s%s
    load_assignment:
      cluster_name: %q%s
      endpoints:%s`, name, extra, name, assignmentExtra, strings.Join(localities, ""))
}

func countUpstreams(t *testing.T, c *http.Client, url string, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := 0; i < n; i++ {
		r := do(t, c, "GET", url, "", nil)
		require.Equal(t, 200, r.code, r.body)
		out[r.header.Get("x-upstream")]++
	}
	return out
}

func TestLoadBalancing(t *testing.T) {
	a := newUpstream(t, "a", false, nil)
	b := newUpstream(t, "b", false, nil)
	cc := newUpstream(t, "c", false, nil)
	hold := make(chan struct{})
	held := make(chan struct{}, 100)
	t.Cleanup(func() { close(hold) })
	busy := newUpstream(t, "busy", false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-upstream", "busy")
		if r.URL.Path == "/lr/hold" {
			held <- struct{}{}
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
	})
	idle := newUpstream(t, "idle", false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-upstream", "idle")
	})
	clusters := clusterYAML("lr", "\n    lb_policy: LEAST_REQUEST\n    least_request_lb_config: {choice_count: 5}", "",
		localityYAML("", endpointYAML(addr(busy), ""), endpointYAML(addr(idle), ""))) +
		clusterYAML("random", "\n    lb_policy: RANDOM", "", localityYAML("", endpointYAML(addr(a), ""), endpointYAML(addr(b), ""))) +
		clusterYAML("prio", "", "", localityYAML("", endpointYAML(addr(a), ""), endpointYAML(addr(cc), "UNHEALTHY")),
			localityYAML("\n          priority: 1", endpointYAML(addr(b), ""))) +
		clusterYAML("prio100", "", "\n      policy: {overprovisioning_factor: 100}",
			localityYAML("", endpointYAML(addr(a), ""), endpointYAML(addr(cc), "UNHEALTHY")),
			localityYAML("\n          priority: 1", endpointYAML(addr(b), ""))) +
		clusterYAML("locality", "\n    common_lb_config: {locality_weighted_lb_config: {}}", "",
			localityYAML("\n          locality: {zone: z1}\n          load_balancing_weight: 1", endpointYAML(addr(a), "")),
			localityYAML("\n          locality: {zone: z2}\n          load_balancing_weight: 3", endpointYAML(addr(b), ""))) +
		clusterYAML("panic", "", "", localityYAML("", endpointYAML(addr(a), "UNHEALTHY"), endpointYAML(addr(b), "UNHEALTHY")))
	routes := routeYAML("/lr", `{cluster: lr}`) + routeYAML("/random", `{cluster: random}`) +
		routeYAML("/prio100", `{cluster: prio100}`) + routeYAML("/prio", `{cluster: prio}`) +
		routeYAML("/locality", `{cluster: locality}`) + routeYAML("/panic", `{cluster: panic}`)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(clusters, listenerYAML("main", "", routes, routerFilter))})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	t.Run("least request avoids the busy host", func(t *testing.T) {
		// Hold a request on "busy"; "idle" answers at once.
		var wg sync.WaitGroup
		onBusy := 0
		for onBusy < 1 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := client(t).Get(base + "/lr/hold")
				if err == nil {
					_ = resp.Body.Close()
				}
			}()
			select {
			case <-held:
				onBusy++
			case <-time.After(200 * time.Millisecond):
			}
		}
		counts := countUpstreams(t, c, base+"/lr", 100)
		// Five random choices all land on the busy host with probability 1/32; round
		// robin would give it half.
		assert.Less(t, counts["busy"], 20, "%v", counts)
		assert.Greater(t, counts["idle"], 80, "%v", counts)
	})
	t.Run("random", func(t *testing.T) {
		prev, switches := "", 0
		counts := map[string]int{}
		for i := 0; i < 200; i++ {
			u := do(t, c, "GET", base+"/random", "", nil).header.Get("x-upstream")
			counts[u]++
			if prev != "" && u != prev {
				switches++
			}
			prev = u
		}
		assert.InDelta(t, 100, counts["a"], 45, "%v", counts)
		// Round robin alternates on every request; random switches about half the time.
		assert.Less(t, switches, 150)
	})
	t.Run("priority load with the overprovisioning factor", func(t *testing.T) {
		// P0 has one healthy host of two: health 1.4 * 50% = 70% of the traffic, P1 the
		// other 30% (Envoy's priority levels table).
		counts := countUpstreams(t, c, base+"/prio", 300)
		assert.Zero(t, counts["c"], "the unhealthy host gets nothing")
		assert.InDelta(t, 90, counts["b"], 35, "%v", counts)
		counts = countUpstreams(t, c, base+"/prio100", 300)
		assert.InDelta(t, 150, counts["b"], 40, "overprovisioning_factor 100: 50%%: %v", counts)
	})
	t.Run("locality weights", func(t *testing.T) {
		counts := countUpstreams(t, c, base+"/locality", 400)
		assert.InDelta(t, 100, counts["a"], 45, "weights 1:3: %v", counts)
	})
	t.Run("panic: no healthy host, every host is used", func(t *testing.T) {
		counts := countUpstreams(t, c, base+"/panic", 20)
		assert.Equal(t, 20, counts["a"]+counts["b"])
		assert.GreaterOrEqual(t, p.Stat("cluster.panic.lb_healthy_panic"), int64(20))
	})
}

func TestCircuitBreakers(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 10)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	up := newUpstream(t, "held", false, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	clusters := staticCluster("cx", `
    circuit_breakers: {thresholds: [{max_connections: 1, max_pending_requests: 1, track_remaining: true}]}`, addr(up)) +
		staticCluster("rq", `
    circuit_breakers: {thresholds: [{max_requests: 1}]}`, addr(up))
	routes := routeYAML("/cx", `{cluster: cx, timeout: 0s}`) + routeYAML("/rq", `{cluster: rq, timeout: 0s}`)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(clusters, listenerYAML("main", "", routes, routerFilter))})
	base := "http://" + p.ListenerAddr("main")

	codes := make(chan int, 10)
	send := func(path string) {
		go func() {
			resp, err := client(t).Get(base + path)
			if err != nil {
				codes <- 0
				return
			}
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	assert.Equal(t, int64(1), p.Stat("cluster.cx.circuit_breakers.default.remaining_cx"))
	send("/cx")
	<-arrived
	send("/cx")
	p.Eventually(5*time.Second, "a pending request", func() bool { return p.Stat("cluster.cx.upstream_rq_pending_active") == 1 })
	assert.Equal(t, int64(1), p.Stat("cluster.cx.circuit_breakers.default.cx_open"))
	assert.Equal(t, int64(1), p.Stat("cluster.cx.circuit_breakers.default.rq_pending_open"))
	assert.Equal(t, int64(0), p.Stat("cluster.cx.circuit_breakers.default.remaining_pending"))

	r := do(t, client(t), "GET", base+"/cx", "", nil)
	assert.Equal(t, 503, r.code)
	assert.Equal(t, "true", r.header.Get("x-envoy-overloaded"))
	assert.Contains(t, r.body, "overflow")
	assert.Equal(t, int64(1), p.Stat("cluster.cx.upstream_rq_pending_overflow"))
	assert.GreaterOrEqual(t, p.Stat("cluster.cx.upstream_cx_overflow"), int64(2))

	send("/rq")
	<-arrived
	r = do(t, client(t), "GET", base+"/rq", "", nil)
	assert.Equal(t, 503, r.code, "max_requests 1")
	assert.Equal(t, int64(1), p.Stat("cluster.rq.upstream_rq_pending_overflow"))
	assert.Equal(t, int64(1), p.Stat("cluster.rq.circuit_breakers.default.rq_open"))

	once.Do(func() { close(release) })
	for i := 0; i < 3; i++ {
		assert.Equal(t, 200, <-codes, "held and pending requests complete")
	}
	p.Eventually(5*time.Second, "UO in the access log", func() bool {
		return strings.Contains(p.Stdout(), `"GET /cx HTTP/1.1" 503 UO`)
	})
	p.Eventually(5*time.Second, "breakers close", func() bool {
		return p.Stat("cluster.cx.circuit_breakers.default.cx_open") == 0 && p.Stat("cluster.cx.circuit_breakers.default.remaining_cx") == 1
	})
}

type clusterStatuses struct {
	Clusters []struct {
		Name  string `json:"name"`
		Hosts []struct {
			Address struct {
				SA struct {
					Port int `json:"port_value"`
				} `json:"socket_address"`
			} `json:"address"`
			Health map[string]any `json:"health_status"`
		} `json:"host_statuses"`
	} `json:"cluster_statuses"`
}

// ejected lists the ports of the hosts /clusters reports as failed_outlier_check.
func ejected(t *testing.T, p *proxytest.Proxy, cluster string) []int {
	_, body := p.Get("/clusters?format=json")
	var cs clusterStatuses
	require.NoError(t, json.Unmarshal([]byte(body), &cs))
	var out []int
	for _, c := range cs.Clusters {
		if c.Name != cluster {
			continue
		}
		for _, h := range c.Hosts {
			if h.Health["failed_outlier_check"] == true {
				out = append(out, h.Address.SA.Port)
			}
		}
	}
	return out
}

func TestOutlierDetection(t *testing.T) {
	bad := newUpstream(t, "bad", false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-upstream", "bad")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	bad2 := newUpstream(t, "bad2", false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-upstream", "bad2")
		w.WriteHeader(http.StatusBadGateway)
	})
	bad3 := newUpstream(t, "bad3", false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-upstream", "bad3")
		w.WriteHeader(http.StatusInternalServerError)
	})
	good := newUpstream(t, "good", false, nil)
	clusters := staticCluster("od", `
    outlier_detection: {consecutive_5xx: 3, interval: 0.1s, base_ejection_time: 3s}`, addr(bad), addr(good)) +
		staticCluster("gw", `
    outlier_detection: {consecutive_5xx: 1000, consecutive_gateway_failure: 2, interval: 1s}`, addr(bad), addr(good)) +
		staticCluster("pct", `
    outlier_detection: {consecutive_5xx: 1, interval: 10s, max_ejection_percent: 50}`, addr(bad), addr(bad2), addr(bad3), addr(good))
	routes := routeYAML("/od", `{cluster: od}`) + routeYAML("/gw", `{cluster: gw}`) + routeYAML("/pct", `{cluster: pct}`)
	p := proxytest.Start(t, proxytest.Options{Bootstrap: bootstrap(clusters, listenerYAML("main", "", routes, routerFilter))})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)
	_, badPort := bad.hostPort()

	t.Run("consecutive 5xx ejects, the host comes back after the ejection time", func(t *testing.T) {
		for i := 0; i < 6; i++ {
			do(t, c, "GET", base+"/od", "", nil)
		}
		assert.Equal(t, int64(1), p.Stat("cluster.od.outlier_detection.ejections_enforced_consecutive_5xx"))
		assert.Equal(t, int64(1), p.Stat("cluster.od.outlier_detection.ejections_active"))
		assert.Equal(t, int64(1), p.Stat("cluster.od.outlier_detection.ejections_enforced_total"))
		assert.Equal(t, []int{badPort}, ejected(t, p, "od"))
		assert.Equal(t, int64(1), p.Stat("cluster.od.membership_healthy"))
		counts := countUpstreams(t, c, base+"/od", 10)
		assert.Equal(t, map[string]int{"good": 10}, counts, "the ejected host gets nothing")
		p.Eventually(10*time.Second, "un-ejection", func() bool {
			return p.Stat("cluster.od.outlier_detection.ejections_active") == 0
		})
		assert.Empty(t, ejected(t, p, "od"))
		hosts := map[string]bool{}
		for i := 0; i < 4; i++ {
			hosts[do(t, c, "GET", base+"/od", "", nil).header.Get("x-upstream")] = true
		}
		assert.True(t, hosts["bad"], "the host is back in rotation")
	})
	t.Run("consecutive gateway failures are detected, not enforced by default", func(t *testing.T) {
		for i := 0; i < 8; i++ {
			do(t, c, "GET", base+"/gw", "", nil)
		}
		assert.GreaterOrEqual(t, p.Stat("cluster.gw.outlier_detection.ejections_detected_consecutive_gateway_failure"), int64(1))
		assert.Equal(t, int64(0), p.Stat("cluster.gw.outlier_detection.ejections_enforced_total"),
			"enforcing_consecutive_gateway_failure defaults to 0")
		assert.Empty(t, ejected(t, p, "gw"))
	})
	t.Run("max_ejection_percent", func(t *testing.T) {
		for i := 0; i < 12; i++ {
			do(t, c, "GET", base+"/pct", "", nil)
		}
		assert.Equal(t, int64(2), p.Stat("cluster.pct.outlier_detection.ejections_active"), "50% of four hosts")
		assert.GreaterOrEqual(t, p.Stat("cluster.pct.outlier_detection.ejections_overflow"), int64(1))
		assert.Len(t, ejected(t, p, "pct"), 2)
	})
}
