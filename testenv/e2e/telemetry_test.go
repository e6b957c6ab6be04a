package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// deploySample reads a filter sample users apply (filters/deploy) and points its module at
// the built filters.
func deploySample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "filters", "deploy", name))
	require.NoError(t, err)
	s := strings.ReplaceAll(string(b), "/etc/istio/extensions/", "{{.WasmDir}}/")
	return s
}

// 2. Telemetry: the telemetry filter, attached by the EnvoyFilter users apply, reports
// Istio's standard metrics on both sides of a hop, with both ends' identities, and the
// dimension the EnvoyFilter adds (request_method) becomes a Prometheus label on the pods that
// ask for it with sidecar.istio.io/extraStatTags. (On a pod that does not, Envoy leaves the
// tag in the metric's name, as the filter's own wasm tests show.)
func TestTelemetry(t *testing.T) {
	cfg := frontBack()
	cfg["telemetry.yaml"] = deploySample(t, "telemetry.envoyfilter.yaml")
	m, ctx := startMesh(t, cfg)
	extraTag := func(s *localmesh.PodSpec) {
		s.Annotations = map[string]string{"sidecar.istio.io/extraStatTags": "request_method"}
	}
	back, err := m.AddPod(ctx, backendPod(extraTag))
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod(extraTag))
	require.NoError(t, err)

	g := steadyLoad(t, ctx, front.URL("/"), 100)
	waitServed(t, g, 200)
	requireNoFailures(t, g)

	hop := map[string]string{
		"source_workload": "frontend-v1", "source_workload_namespace": "default", "source_app": "frontend",
		"destination_workload": "backend-v1", "destination_workload_namespace": "default", "destination_app": "backend",
		"destination_service": "backend.default.svc.cluster.local", "destination_service_name": "backend",
		"response_code": "200", "request_protocol": "http",
	}
	scrape := func(p *localmesh.Pod) localmesh.Metrics {
		var ms localmesh.Metrics
		require.Eventually(t, func() bool {
			var err error
			ms, err = p.Metrics(ctx)
			return err == nil && ms.Sum("istio_requests_total", nil) > 0
		}, 20*time.Second, 100*time.Millisecond, "no istio_requests_total on %s", p.Spec.Name)
		return ms
	}
	client := scrape(front)
	server := scrape(back)

	src := with(hop, "reporter", "source")
	assert.GreaterOrEqual(t, client.Sum("istio_requests_total", src), 200.0,
		"the client side reports the hop: %v", client.Series("istio_requests_total", nil))
	dst := with(hop, "reporter", "destination")
	assert.GreaterOrEqual(t, server.Sum("istio_requests_total", dst), 200.0,
		"the server side reports the hop: %v", server.Series("istio_requests_total", nil))

	// request_host is one of Istio's default tags; request_method comes from the annotation.
	for _, c := range []struct {
		ms     localmesh.Metrics
		labels map[string]string
	}{{client, src}, {server, dst}} {
		assert.NotEmpty(t, c.ms.Series("istio_requests_total", with(c.labels, "request_host", "backend.default.svc.cluster.local:9081")))
		assert.NotEmpty(t, c.ms.Series("istio_requests_total", with(c.labels, "request_method", "GET")),
			"request_method label from the annotation")
	}

	// Duration histograms, with buckets.
	d := client.Series("istio_request_duration_milliseconds", src)
	require.NotEmpty(t, d)
	assert.GreaterOrEqual(t, d[0].Value, 200.0)
	assert.NotEmpty(t, d[0].Buckets)
	for _, name := range []string{"istio_request_bytes", "istio_response_bytes"} {
		assert.NotEmpty(t, server.Series(name, dst), name)
	}

	// Every series on both pages has a clean name: the filter's overflow counter, defined
	// at zero for each metric, carries the metric it counts for as a label, not in its name.
	for _, p := range []*localmesh.Pod{front, back} {
		ms := requireCleanNames(t, ctx, p)
		for _, metric := range []string{"istio_requests_total", "istio_request_duration_milliseconds", "istio_request_bytes", "istio_response_bytes"} {
			assert.Len(t, ms.Series("wasmesh_telemetry_overflow_total", map[string]string{"metric": metric}), 1,
				"%s: the overflow counter of %s: %v", p.Spec.Name, metric, ms.Series("wasmesh_telemetry_overflow_total", nil))
		}
	}
}

func with(m map[string]string, kv ...string) map[string]string {
	c := make(map[string]string, len(m)+len(kv)/2)
	for k, v := range m {
		c[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		c[kv[i]] = kv[i+1]
	}
	return c
}
