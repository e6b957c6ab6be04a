package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// flaky is an upstream that fails the first n attempts of each x-key (n from x-fail,
// with the status from x-fail-status, 503 by default; x-fail-mode "reset" drops the
// connection, "hang" waits until the request is cancelled) and then answers 200 with the
// request body echoed. It records every attempt.
type flaky struct {
	mu       sync.Mutex
	attempts map[string]int
	seen     []http.Header
	bodies   map[string][]string
	name     string
}

func newFlaky(t *testing.T, name string) (*flaky, *upstream) {
	f := &flaky{attempts: map[string]int{}, bodies: map[string][]string{}, name: name}
	u := newUpstream(t, name, false, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("x-key")
		f.mu.Lock()
		f.attempts[key]++
		n := f.attempts[key]
		f.seen = append(f.seen, r.Header.Clone())
		f.bodies[key] = append(f.bodies[key], string(body))
		f.mu.Unlock()
		fail, _ := strconv.Atoi(r.Header.Get("x-fail"))
		w.Header().Set("x-upstream", name)
		w.Header().Set("x-attempt-seen", r.Header.Get("x-envoy-attempt-count"))
		w.Header().Set("x-expected-timeout", r.Header.Get("x-envoy-expected-rq-timeout-ms"))
		if n <= fail {
			switch r.Header.Get("x-fail-mode") {
			case "reset":
				hj, ok := w.(http.Hijacker)
				if ok {
					c, _, _ := hj.Hijack()
					_ = c.Close()
					return
				}
			case "hang":
				<-r.Context().Done()
				return
			}
			code := 503
			if s := r.Header.Get("x-fail-status"); s != "" {
				code, _ = strconv.Atoi(s)
			}
			w.WriteHeader(code)
			_, _ = fmt.Fprintf(w, "failure %d", n)
			return
		}
		_, _ = fmt.Fprintf(w, "ok after %d: %s", n, body)
	})
	return f, u
}

func (f *flaky) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts[key]
}

func (f *flaky) bodiesOf(key string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.bodies[key]...)
}

func routeYAML(match, action string) string {
	return fmt.Sprintf(`
              - match: {prefix: %s}
                route: %s`, match, action)
}

func listenerYAML(name, vhostExtra, routes string, filters string) string {
	return `
  - name: ` + name + `
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:` + fmt.Sprintf(hcmHeader, name) + `
          route_config:
            name: ` + name + `
            virtual_hosts:
            - name: ` + name + `
              domains: ["*"]` + vhostExtra + `
              routes:` + routes + filters + "\n"
}

func bootstrap(clusters, listeners string) string {
	return `
node: {id: sidecar~127.0.0.1~t.default~default.svc.cluster.local, cluster: t.default}
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  clusters:` + clusters + `
  listeners:` + listeners
}

func doBody(t *testing.T, c *http.Client, method, url string, body []byte, hdr map[string]string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return result{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func TestRetries(t *testing.T) {
	f, up := newFlaky(t, "flaky")
	good := newUpstream(t, "good", false, nil)
	deadAddr := refusingAddr(t)
	backoff := `, retry_back_off: {base_interval: 0.001s, max_interval: 0.002s}`
	routes := routeYAML("/5xx", `{cluster: flaky, retry_policy: {retry_on: 5xx, num_retries: 2`+backoff+`}}`) +
		routeYAML("/gw", `{cluster: flaky, retry_policy: {retry_on: gateway-error, num_retries: 2`+backoff+`}}`) +
		routeYAML("/codes", `{cluster: flaky, retry_policy: {retry_on: retriable-status-codes, retriable_status_codes: [418], num_retries: 2`+backoff+`}}`) +
		routeYAML("/reset", `{cluster: flaky, retry_policy: {retry_on: reset, num_retries: 1`+backoff+`}}`) +
		routeYAML("/pertry", `{cluster: flaky, timeout: 10s, retry_policy: {retry_on: 5xx, num_retries: 1, per_try_timeout: 1s`+backoff+`}}`) +
		routeYAML("/connect", `{cluster: half-dead, retry_policy: {retry_on: connect-failure, num_retries: 3`+backoff+`,
                  retry_host_predicate: [{name: envoy.retry_host_predicates.previous_hosts,
                    typed_config: {"@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate}}],
                  host_selection_retry_max_attempts: 3}}`) +
		routeYAML("/overflow", `{cluster: no-retries, retry_policy: {retry_on: 5xx, num_retries: 2`+backoff+`}}`) +
		routeYAML("/none", `{cluster: flaky}`)
	boot := bootstrap(staticCluster("flaky", "", addr(up))+staticCluster("half-dead", "", deadAddr, addr(good))+
		staticCluster("no-retries", `
    circuit_breakers: {thresholds: [{max_retries: 0}]}`, addr(up)),
		listenerYAML("main", `
              include_request_attempt_count: true
              include_attempt_count_in_response: true`, routes, routerFilter))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	t.Run("5xx is retried until it succeeds, with x-envoy-attempt-count", func(t *testing.T) {
		r := do(t, c, "GET", base+"/5xx", "", map[string]string{"x-key": "a", "x-fail": "2"})
		assert.Equal(t, 200, r.code, r.body)
		assert.Equal(t, 3, f.count("a"))
		assert.Equal(t, "3", r.header.Get("x-attempt-seen"), "the upstream sees the attempt number")
		assert.Equal(t, "3", r.header.Get("x-envoy-attempt-count"), "the downstream sees how many attempts")
		assert.GreaterOrEqual(t, p.Stat("cluster.flaky.upstream_rq_retry"), int64(2))
		assert.GreaterOrEqual(t, p.Stat("cluster.flaky.upstream_rq_retry_success"), int64(1))
		assert.GreaterOrEqual(t, p.Stat("cluster.flaky.retry.upstream_rq_503"), int64(2))
	})
	t.Run("retries run out: the last response passes with URX", func(t *testing.T) {
		r := do(t, c, "GET", base+"/5xx", "", map[string]string{"x-key": "b", "x-fail": "5"})
		assert.Equal(t, 503, r.code)
		assert.Equal(t, "failure 3", r.body, "num_retries 2: three attempts")
		assert.Equal(t, 3, f.count("b"))
		assert.GreaterOrEqual(t, p.Stat("cluster.flaky.upstream_rq_retry_limit_exceeded"), int64(1))
		p.Eventually(5*time.Second, "URX in the access log", func() bool {
			return strings.Contains(p.Stdout(), `"GET /5xx HTTP/1.1" 503 URX`)
		})
	})
	t.Run("gateway-error retries 502-504 only", func(t *testing.T) {
		r := do(t, c, "GET", base+"/gw", "", map[string]string{"x-key": "c", "x-fail": "1", "x-fail-status": "500"})
		assert.Equal(t, 500, r.code)
		assert.Equal(t, 1, f.count("c"))
		r = do(t, c, "GET", base+"/gw", "", map[string]string{"x-key": "d", "x-fail": "1", "x-fail-status": "504"})
		assert.Equal(t, 200, r.code)
		assert.Equal(t, 2, f.count("d"))
	})
	t.Run("retriable-status-codes", func(t *testing.T) {
		r := do(t, c, "GET", base+"/codes", "", map[string]string{"x-key": "e", "x-fail": "1", "x-fail-status": "418"})
		assert.Equal(t, 200, r.code)
		assert.Equal(t, 2, f.count("e"))
		r = do(t, c, "GET", base+"/codes", "", map[string]string{"x-key": "f", "x-fail": "1", "x-fail-status": "503"})
		assert.Equal(t, 503, r.code, "503 is not in the list")
		assert.Equal(t, 1, f.count("f"))
	})
	t.Run("x-envoy-retry-on without a route policy", func(t *testing.T) {
		r := do(t, c, "GET", base+"/none", "", map[string]string{"x-key": "g", "x-fail": "1", "x-envoy-retry-on": "5xx"})
		assert.Equal(t, 200, r.code)
		assert.Equal(t, 2, f.count("g"))
		r = do(t, c, "GET", base+"/none", "", map[string]string{"x-key": "h", "x-fail": "1"})
		assert.Equal(t, 503, r.code, "no policy, no header: no retry")
	})
	t.Run("reset before headers is retried", func(t *testing.T) {
		r := do(t, c, "GET", base+"/reset", "", map[string]string{"x-key": "i", "x-fail": "1", "x-fail-mode": "reset"})
		assert.Equal(t, 200, r.code, r.body)
		assert.Equal(t, 2, f.count("i"))
	})
	t.Run("per try timeout is retried under 5xx", func(t *testing.T) {
		r := do(t, c, "GET", base+"/pertry", "", map[string]string{"x-key": "j", "x-fail": "1", "x-fail-mode": "hang"})
		assert.Equal(t, 200, r.code, r.body)
		assert.Equal(t, 2, f.count("j"))
		assert.Equal(t, "1000", r.header.Get("x-expected-timeout"), "the per try timeout is what the upstream may use")
		assert.GreaterOrEqual(t, p.Stat("cluster.flaky.upstream_rq_per_try_timeout"), int64(1))
	})
	t.Run("request bodies are replayed on retry", func(t *testing.T) {
		payload := bytes.Repeat([]byte("0123456789"), 5000)
		r := doBody(t, c, "POST", base+"/5xx", payload, map[string]string{"x-key": "k", "x-fail": "1"})
		assert.Equal(t, 200, r.code)
		bodies := f.bodiesOf("k")
		require.Len(t, bodies, 2)
		assert.Equal(t, string(payload), bodies[0])
		assert.Equal(t, string(payload), bodies[1])
	})
	t.Run("connect failures move to another host with previous_hosts", func(t *testing.T) {
		for i := 0; i < 20; i++ {
			r := do(t, c, "GET", base+"/connect", "", nil)
			require.Equal(t, 200, r.code, r.body)
			assert.Equal(t, "good", r.header.Get("x-upstream"))
		}
		assert.GreaterOrEqual(t, p.Stat("cluster.half-dead.upstream_rq_retry"), int64(1))
		assert.GreaterOrEqual(t, p.Stat("cluster.half-dead.upstream_cx_connect_fail"), int64(1))
	})
	t.Run("max_retries circuit breaker: no retry, UO", func(t *testing.T) {
		r := do(t, c, "GET", base+"/overflow", "", map[string]string{"x-key": "l", "x-fail": "1"})
		assert.Equal(t, 503, r.code)
		assert.Equal(t, 1, f.count("l"))
		assert.Equal(t, int64(1), p.Stat("cluster.no-retries.upstream_rq_retry_overflow"))
		p.Eventually(5*time.Second, "UO in the access log", func() bool {
			return strings.Contains(p.Stdout(), `"GET /overflow HTTP/1.1" 503 UO`)
		})
	})
}

func TestTimeouts(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	seen := make(chan string, 10)
	slow := newUpstream(t, "slow", false, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("x-envoy-expected-rq-timeout-ms")
		if r.URL.Path == "/idle-body" {
			w.WriteHeader(200)
			_, _ = w.Write([]byte("start"))
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	routes := routeYAML("/global", `{cluster: slow, timeout: 0.3s, retry_policy: {retry_on: 5xx, num_retries: 10, per_try_timeout: 0.1s}}`) +
		routeYAML("/header", `{cluster: slow}`) +
		routeYAML("/idle", `{cluster: slow, timeout: 0s, idle_timeout: 0.2s}`)
	boot := bootstrap(staticCluster("slow", "", addr(slow)), listenerYAML("main", "", routes, routerFilter))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	t.Run("the route timeout bounds all retries", func(t *testing.T) {
		r := do(t, c, "GET", base+"/global", "", nil)
		assert.Equal(t, http.StatusGatewayTimeout, r.code)
		assert.Equal(t, "upstream request timeout", r.body)
		assert.Equal(t, "100", <-seen)
		assert.GreaterOrEqual(t, p.Stat("cluster.slow.upstream_rq_per_try_timeout"), int64(1))
		// Counted as the stream ends, which may be just after the client has its answer.
		p.Eventually(5*time.Second, "upstream_rq_timeout counted once", func() bool { return p.Stat("cluster.slow.upstream_rq_timeout") == 1 })
		assert.Less(t, p.Stat("cluster.slow.upstream_rq_retry"), int64(10), "the route timeout ended the retries")
	})
	drain(seen)
	t.Run("x-envoy-upstream-rq-timeout-ms overrides the route timeout", func(t *testing.T) {
		r := do(t, c, "GET", base+"/header", "", map[string]string{"x-envoy-upstream-rq-timeout-ms": "150"})
		assert.Equal(t, http.StatusGatewayTimeout, r.code)
		assert.Equal(t, "150", <-seen)
	})
	drain(seen)
	t.Run("idle timeout before the response: 504 stream timeout, SI", func(t *testing.T) {
		r := do(t, c, "GET", base+"/idle", "", nil)
		assert.Equal(t, http.StatusGatewayTimeout, r.code)
		assert.Equal(t, "stream timeout", r.body)
		p.Eventually(5*time.Second, "SI in the access log", func() bool {
			return strings.Contains(p.Stdout(), `"GET /idle HTTP/1.1" 504 SI`)
		})
	})
	t.Run("idle timeout after the response started: the stream is reset", func(t *testing.T) {
		resp, err := c.Get(base + "/idle-body")
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode)
		_, err = io.ReadAll(resp.Body)
		assert.Error(t, err, "the body ends with an error, not EOF")
	})
}

func drain(ch chan string) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func TestMirroring(t *testing.T) {
	type shadowReq struct{ host, path, body string }
	got := make(chan shadowReq, 100)
	shadow := newUpstream(t, "shadow", false, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/half" {
			got <- shadowReq{host: r.Host, path: r.URL.Path, body: string(b)}
		}
		w.WriteHeader(500) // a failing shadow never shows downstream
	})
	main := newUpstream(t, "main", false, nil)
	routes := routeYAML("/all", `{cluster: main, request_mirror_policies: [{cluster: shadow}]}`) +
		routeYAML("/none", `{cluster: main, request_mirror_policies: [{cluster: shadow0, runtime_fraction: {default_value: {numerator: 0}}}]}`) +
		routeYAML("/half", `{cluster: main, request_mirror_policies: [{cluster: shadow, runtime_fraction: {default_value: {numerator: 50}}}]}`)
	boot := bootstrap(staticCluster("main", "", addr(main))+staticCluster("shadow", "", addr(shadow))+staticCluster("shadow0", "", addr(shadow)),
		listenerYAML("main", "", routes, routerFilter))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	r := doBody(t, c, "POST", base+"/all/x", []byte("payload"), nil)
	assert.Equal(t, 200, r.code)
	assert.Equal(t, "main", r.header.Get("x-upstream"))
	select {
	case s := <-got:
		assert.Equal(t, "/all/x", s.path)
		assert.Equal(t, "payload", s.body, "the shadow gets the body")
		assert.Equal(t, p.ListenerAddr("main")[:len("127.0.0.1")]+"-shadow"+p.ListenerAddr("main")[len("127.0.0.1"):], s.host,
			"Envoy appends -shadow to the host, before the port")
	case <-time.After(10 * time.Second):
		t.Fatal("the shadow got nothing")
	}
	req, _ := http.NewRequest("GET", base+"/all/named", nil)
	req.Host = "svc.example"
	resp, err := c.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	select {
	case s := <-got:
		assert.Equal(t, "svc.example-shadow", s.host)
	case <-time.After(10 * time.Second):
		t.Fatal("the shadow got nothing")
	}

	// runtime_fraction: 0% never mirrors, 50% mirrors about half.
	for i := 0; i < 10; i++ {
		assert.Equal(t, 200, do(t, c, "GET", base+"/none", "", nil).code)
	}
	const n = 200
	for i := 0; i < n; i++ {
		assert.Equal(t, 200, do(t, c, "GET", base+"/half", "", nil).code)
	}
	p.Eventually(10*time.Second, "mirrored requests settle", func() bool {
		return p.Stat("cluster.shadow.upstream_rq_active") == 0 && p.Stat("cluster.shadow.upstream_rq_total") >= 2+50
	})
	half := p.Stat("cluster.shadow.upstream_rq_total") - 2
	assert.InDelta(t, n/2, half, 40, "50%% of %d mirrored (sd 7)", n)
	assert.Equal(t, int64(0), max(p.Stat("cluster.shadow0.upstream_rq_total"), 0), "0% is never mirrored")
	assert.GreaterOrEqual(t, p.Stat("cluster.shadow.upstream_rq_5xx"), int64(2), "shadow failures are counted on the shadow cluster")
}

func TestHashPolicies(t *testing.T) {
	var addrs []string
	for i := 0; i < 4; i++ {
		addrs = append(addrs, addr(newUpstream(t, fmt.Sprintf("h%d", i), false, nil)))
	}
	cookie := `{cluster: ring, hash_policy: [{cookie: {name: session, ttl: 3600s, path: /}}]}`
	routes := routeYAML("/header", `{cluster: ring, hash_policy: [{header: {header_name: x-user}}]}`) +
		routeYAML("/query", `{cluster: maglev, hash_policy: [{query_parameter: {name: u}}]}`) +
		routeYAML("/cookie", cookie) +
		routeYAML("/ip", `{cluster: ring, hash_policy: [{connection_properties: {source_ip: true}}]}`) +
		routeYAML("/nohash", `{cluster: ring}`)
	boot := bootstrap(staticCluster("ring", `
    lb_policy: RING_HASH
    ring_hash_lb_config: {minimum_ring_size: 64}`, addrs...)+staticCluster("maglev", `
    lb_policy: MAGLEV
    maglev_lb_config: {table_size: 251}`, addrs...),
		listenerYAML("main", "", routes, routerFilter))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot})
	base := "http://" + p.ListenerAddr("main")
	c := client(t)

	sticky := func(t *testing.T, path string, hdr func(i int) map[string]string) {
		t.Helper()
		hosts := map[string]bool{}
		for user := 0; user < 12; user++ {
			first := ""
			for i := 0; i < 5; i++ {
				r := do(t, c, "GET", fmt.Sprintf(path, user), "", hdr(user))
				require.Equal(t, 200, r.code)
				if first == "" {
					first = r.header.Get("x-upstream")
				}
				assert.Equal(t, first, r.header.Get("x-upstream"), "user %d always lands on one host", user)
			}
			hosts[first] = true
		}
		assert.GreaterOrEqual(t, len(hosts), 2, "users spread over the hosts: %v", hosts)
	}
	t.Run("header on a ring hash", func(t *testing.T) {
		sticky(t, base+"/header?%d", func(i int) map[string]string { return map[string]string{"x-user": fmt.Sprint("user-", i)} })
		assert.Equal(t, int64(64), p.Stat("cluster.ring.ring_hash_lb.size"))
	})
	t.Run("query parameter on maglev", func(t *testing.T) {
		sticky(t, base+"/query?u=%d", func(int) map[string]string { return nil })
		assert.Greater(t, p.Stat("cluster.maglev.maglev_lb.min_entries_per_host"), int64(0))
	})
	t.Run("cookie with ttl is generated, then sticky", func(t *testing.T) {
		r := do(t, c, "GET", base+"/cookie", "", nil)
		sc := r.header.Get("set-cookie")
		require.True(t, strings.HasPrefix(sc, `session="`), sc)
		assert.Contains(t, sc, "Max-Age=3600")
		assert.Contains(t, sc, "Path=/")
		assert.Contains(t, sc, "HttpOnly")
		val := strings.Trim(strings.SplitN(strings.TrimPrefix(sc, "session="), ";", 2)[0], `"`)
		want := r.header.Get("x-upstream")
		for i := 0; i < 10; i++ {
			r := do(t, c, "GET", base+"/cookie", "", map[string]string{"cookie": "session=" + val})
			assert.Equal(t, want, r.header.Get("x-upstream"))
			assert.Empty(t, r.header.Get("set-cookie"), "an existing cookie is not set again")
		}
		sticky(t, base+"/cookie?%d", func(i int) map[string]string { return map[string]string{"cookie": fmt.Sprint("session=s", i)} })
	})
	t.Run("source ip", func(t *testing.T) {
		first := ""
		for i := 0; i < 10; i++ {
			r := do(t, client(t), "GET", base+"/ip", "", nil) // a new connection (and port) each time
			if first == "" {
				first = r.header.Get("x-upstream")
			}
			assert.Equal(t, first, r.header.Get("x-upstream"))
		}
	})
	t.Run("without a hash policy a ring hash spreads requests", func(t *testing.T) {
		hosts := map[string]bool{}
		for i := 0; i < 40; i++ {
			hosts[do(t, c, "GET", base+"/nohash", "", map[string]string{"x-user": "same"}).header.Get("x-upstream")] = true
		}
		assert.GreaterOrEqual(t, len(hosts), 2)
	})
}
