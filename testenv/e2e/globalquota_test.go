package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// globalLimit is the front end's limit per second in the rate-limit service's config.
const globalLimit = 10

// rateLimitConfig is the service's configuration (Envoy ratelimit's YAML): domain e2e,
// the front end's limit of globalLimit per second, in shadow mode or not, failing open or
// closed when Redis is down.
func rateLimitConfig(shadow, deny bool) string {
	return fmt.Sprintf(`domain: e2e
failure_mode_deny: %v
descriptors:
- key: generic_key
  value: front
  shadow_mode: %v
  rate_limit: {unit: second, requests_per_unit: %d}
`, deny, shadow, globalLimit)
}

// globalQuotaPlugin puts the quota filter in global mode on every frontend pod: one
// descriptor, the same for every request, decided by the mesh's rate-limit service. The
// timeout is long (the machine is shared) so that every decision is the service's.
const globalQuotaPlugin = `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: frontend-global-quota, namespace: default}
spec:
  selector: {matchLabels: {app: frontend}}
  url: file://{{.WasmDir}}/quota.wasm
  phase: AUTHZ
  failStrategy: FAIL_CLOSE
  pluginConfig:
    name: frontend
    rate_limit_headers: true # an allowed answer names the limit too
    rate_limit_service: {cluster: "` + localmesh.RateLimitCluster + `", domain: e2e, timeout: 2s,
      authority: "` + localmesh.RateLimitHost + `:8081"}
    descriptors:
    - name: front
      mode: global
      entries: [{key: generic_key, source: generic_key, value: front}]
`

// answer is what a client outside the mesh saw for one request.
type answer struct {
	status                              int
	limit, remaining, reset, retryAfter string
	err                                 error
}

// frontendClient calls both frontend pods' inbound listeners, as callers outside the mesh.
type frontendClient struct {
	pods   []*localmesh.Pod
	client *http.Client
}

func (c *frontendClient) get(p *localmesh.Pod) answer {
	resp, err := c.client.Get(p.URL("/"))
	if err != nil {
		return answer{err: err}
	}
	resp.Body.Close()
	h := resp.Header
	return answer{status: resp.StatusCode, limit: h.Get("x-ratelimit-limit"), remaining: h.Get("x-ratelimit-remaining"),
		reset: h.Get("x-ratelimit-reset"), retryAfter: h.Get("retry-after")}
}

// burst sends n requests to each pod at once (a few in flight per pod) and returns the
// answers and whether they all fell in one second of the clock, the service's window.
func (c *frontendClient) burst(n int) (answers []answer, oneWindow bool) {
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range c.pods {
		work := make(chan struct{}, n)
		for range n {
			work <- struct{}{}
		}
		close(work)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					a := c.get(p)
					mu.Lock()
					answers = append(answers, a)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return answers, time.Now().Truncate(time.Second).Equal(start.Truncate(time.Second))
}

// alignedBurst is burst started just after a second begins, tried again (up to three
// times) if it spilled into the next second.
func (c *frontendClient) alignedBurst(t *testing.T, n int) []answer {
	t.Helper()
	for attempt := 1; ; attempt++ {
		now := time.Now()
		time.Sleep(now.Truncate(time.Second).Add(time.Second + 20*time.Millisecond).Sub(now))
		answers, one := c.burst(n)
		if one || attempt == 3 {
			require.True(t, one, "three bursts of %d requests each took more than their second", 2*n)
			return answers
		}
		t.Logf("the burst spilled into the next second; again")
	}
}

func countStatuses(answers []answer) map[int]int {
	out := map[int]int{}
	for _, a := range answers {
		if a.err != nil {
			out[-1]++
			continue
		}
		out[a.status]++
	}
	return out
}

func skipWithoutRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "redis-server is not on PATH (`make tools` installs Debian's redis-server)"
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// globalQuotaMesh is two frontend pods (two proxies) behind the global limit, and the
// mesh's rate-limit service with its Redis.
func globalQuotaMesh(t *testing.T) (*localmesh.Mesh, context.Context, *frontendClient) {
	skipWithoutRedis(t)
	bin, wasmDir := meshtest.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	m, err := localmesh.Start(ctx, localmesh.Options{BinDir: bin, WasmDir: wasmDir, Logf: t.Logf,
		RateLimitConfig: rateLimitConfig(false, false),
		Config: map[string]string{
			"services.yaml": meshtest.ServiceEntry("frontend", 9080, 8080),
			"quota.yaml":    globalQuotaPlugin,
		}})
	if err != nil && strings.Contains(err.Error(), "no envoy on PATH") {
		t.Skip("MESH_PROXY=envoy but there is no envoy on PATH")
	}
	require.NoError(t, err)
	meshtest.CloseAtEnd(t, m.Dir(), m.Close)
	c := &frontendClient{client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}
	for range 2 {
		p, err := m.AddPod(ctx, localmesh.PodSpec{Labels: map[string]string{"app": "frontend", "version": "v1"}})
		require.NoError(t, err)
		c.pods = append(c.pods, p)
	}
	// The plugin is in force on both proxies once each has answered a 429.
	for _, p := range c.pods {
		eventually(t, p.Spec.Name+" applies the global limit", func() bool {
			for range globalLimit + 1 {
				if c.get(p).status == http.StatusTooManyRequests {
					return true
				}
			}
			return false
		})
	}
	return m, ctx, c
}

// Two proxies share one limit: across both, a second's allowed requests are the limit; the
// others get 429 with the x-ratelimit-* headers and retry-after.
func requireSharedLimit(t *testing.T, c *frontendClient) {
	t.Helper()
	answers := c.alignedBurst(t, 15)
	statuses := countStatuses(answers)
	require.Equal(t, map[int]int{200: globalLimit, 429: 30 - globalLimit}, statuses,
		"one limit of %d per second across both proxies", globalLimit)
	for _, a := range answers {
		if a.status == http.StatusTooManyRequests {
			assert.Equal(t, fmt.Sprint(globalLimit), a.limit, "x-ratelimit-limit")
			assert.Equal(t, "0", a.remaining, "x-ratelimit-remaining")
			assert.Equal(t, "1", a.reset, "x-ratelimit-reset: the window ends within the second")
			assert.Equal(t, "1", a.retryAfter, "retry-after")
		} else {
			assert.Equal(t, fmt.Sprint(globalLimit), a.limit, "an allowed answer names the limit too")
		}
	}
}

// serviceMetric sums a metric of the rate-limit service's /metrics.
func serviceMetric(t *testing.T, ctx context.Context, m *localmesh.Mesh, name string, match map[string]string) float64 {
	t.Helper()
	b, err := getURL(m.RateLimit().MetricsURL("/metrics"))
	require.NoError(t, err)
	ms, err := localmesh.ParseMetrics(b)
	require.NoError(t, err)
	return ms.Sum(name, match)
}

// The proof of the global quota in the local mesh, with real processes: two
// frontend proxies, the quota filter's global mode in each, bin/ratelimit and a real
// redis-server.
func TestGlobalQuota(t *testing.T) {
	m, ctx, c := globalQuotaMesh(t)

	t.Run("the front end's proxy has the service's cluster", func(t *testing.T) {
		requireRateLimitCluster(t, ctx, c.pods[0], m.RateLimit().GRPCAddr())
	})
	t.Run("shared limit", func(t *testing.T) { requireSharedLimit(t, c) })

	t.Run("shadow mode counts without rejecting", func(t *testing.T) {
		require.NoError(t, m.WriteRateLimitConfig("config.yaml", rateLimitConfig(true, false)))
		eventually(t, "shadow mode applies", func() bool { return countStatuses(c.alignedBurst(t, 8))[200] == 16 })
		before := serviceMetric(t, ctx, m, "ratelimit_service_rate_limit_shadow_mode", nil)
		statuses := countStatuses(c.alignedBurst(t, 15))
		assert.Equal(t, map[int]int{200: 30}, statuses, "shadow mode never refuses")
		over := serviceMetric(t, ctx, m, "ratelimit_service_rate_limit_shadow_mode", nil) - before
		assert.Equal(t, float64(30-globalLimit), over, "the hits over the limit are counted as shadow_mode")
		require.NoError(t, m.WriteRateLimitConfig("config.yaml", rateLimitConfig(false, false)))
		eventually(t, "enforcing again", func() bool { return countStatuses(c.alignedBurst(t, 8))[429] > 0 })
	})

	t.Run("redis killed: fail open, then closed, then counting resumes", func(t *testing.T) {
		m.KillRedis()
		statuses := countStatuses(c.alignedBurst(t, 15))
		assert.Equal(t, map[int]int{200: 30}, statuses, "failure_mode_deny false: everything goes through")
		assert.Positive(t, serviceMetric(t, ctx, m, "ratelimit_service_failure_policy_total", map[string]string{"policy": "open"}))

		require.NoError(t, m.WriteRateLimitConfig("config.yaml", rateLimitConfig(false, true)))
		eventually(t, "failing closed", func() bool { return countStatuses(c.alignedBurst(t, 4))[429] == 8 })
		for _, a := range c.alignedBurst(t, 4) {
			assert.Equal(t, http.StatusTooManyRequests, a.status, "failure_mode_deny true: every request is refused")
		}

		require.NoError(t, m.StartRedis(ctx))
		requireAllRunning(t, m, c)
		// The service's Redis client probes a lost server once a second (go-redis's dial
		// breaker), so the first decisions after the restart may still fail closed.
		eventually(t, "counting resumes", func() bool { return countStatuses(c.alignedBurst(t, 4))[200] == 8 })
		requireSharedLimit(t, c)
	})

	t.Run("a bad config file keeps the last good limit", func(t *testing.T) {
		before := serviceMetric(t, ctx, m, "ratelimit_service_config_load_total", map[string]string{"result": "error"})
		require.NoError(t, m.WriteRateLimitConfig("config.yaml", strings.Replace(rateLimitConfig(false, false), "unit: second", "unit: fortnight", 1)))
		require.Eventually(t, func() bool {
			return serviceMetric(t, ctx, m, "ratelimit_service_config_load_total", map[string]string{"result": "error"}) > before
		}, 10*time.Second, 50*time.Millisecond, "the service rejects the file")
		health, err := getURL(m.RateLimit().MetricsURL("/healthz"))
		require.NoError(t, err)
		assert.Contains(t, string(health), "config.yaml", "/healthz names the rejected file")
		assert.Contains(t, string(health), "fortnight", "and what is wrong in it")
		requireSharedLimit(t, c)
	})
	requireAllRunning(t, m, c)
}

// requireAllRunning: nothing crashed, neither proxy nor the service.
func requireAllRunning(t *testing.T, m *localmesh.Mesh, c *frontendClient) {
	t.Helper()
	for _, p := range c.pods {
		require.True(t, p.Running(), "%s runs", p.Spec.Name)
	}
	require.True(t, m.RateLimit().Running(), "the rate-limit service runs")
}

// requireRateLimitCluster: the proxy's config_dump has the cluster discovery made of the
// ServiceEntry, EDS and HTTP/2 (protocol GRPC), with the service's address as its endpoint.
func requireRateLimitCluster(t *testing.T, ctx context.Context, p *localmesh.Pod, serviceAddr string) {
	t.Helper()
	b, err := p.Admin(ctx, "/config_dump?include_eds")
	require.NoError(t, err)
	var dump struct {
		Configs []struct {
			DynamicActiveClusters []struct {
				Cluster struct {
					Name                          string          `json:"name"`
					Type                          string          `json:"type"`
					TypedExtensionProtocolOptions json.RawMessage `json:"typed_extension_protocol_options"`
				} `json:"cluster"`
			} `json:"dynamic_active_clusters"`
			DynamicEndpointConfigs []struct {
				EndpointConfig json.RawMessage `json:"endpoint_config"`
			} `json:"dynamic_endpoint_configs"`
		} `json:"configs"`
	}
	require.NoError(t, json.Unmarshal(b, &dump))
	var found, endpoint bool
	for _, c := range dump.Configs {
		for _, dc := range c.DynamicActiveClusters {
			if dc.Cluster.Name == localmesh.RateLimitCluster {
				found = true
				assert.Equal(t, "EDS", dc.Cluster.Type)
				assert.Contains(t, string(dc.Cluster.TypedExtensionProtocolOptions), "http2_protocol_options", "gRPC needs HTTP/2")
			}
		}
		for _, e := range c.DynamicEndpointConfigs {
			s := string(e.EndpointConfig)
			if strings.Contains(s, localmesh.RateLimitCluster) {
				host, port, _ := net.SplitHostPort(serviceAddr)
				endpoint = strings.Contains(s, host) && strings.Contains(s, port)
			}
		}
	}
	assert.True(t, found, "%s has the cluster %s", p.Spec.Name, localmesh.RateLimitCluster)
	assert.True(t, endpoint, "its endpoint is the service's address")
}
