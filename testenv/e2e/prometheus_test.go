package e2e

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
	"github.com/wasmesh/wasmesh/testenv/promserver"
)

// dashboardQueries are the queries of Istio's standard Grafana dashboards (mesh, service,
// workload, control plane) that the local mesh has data for, each with the labels its
// series must carry. From istio/istio manifests/addons/dashboards: istio-mesh-dashboard,
// istio-service-dashboard, istio-workload-dashboard, pilot-dashboard.
var dashboardQueries = []struct {
	name, expr string
	labels     []string
}{
	{"global request volume", `round(sum(irate(istio_requests_total{reporter="source"}[1m])), 0.001)`, nil},
	{"global success rate", `sum(rate(istio_requests_total{reporter="source", response_code!~"5.*"}[1m])) / sum(rate(istio_requests_total{reporter="source"}[1m]))`, nil},
	{"requests by source and destination workload", `sum(irate(istio_requests_total{reporter="destination"}[1m])) by (source_workload, source_workload_namespace, destination_workload, response_code)`,
		[]string{"source_workload", "destination_workload", "response_code"}},
	{"P50 latency by workload", latencyQuery(0.50), []string{"source_workload", "destination_workload"}},
	{"P90 latency by workload", latencyQuery(0.90), []string{"source_workload", "destination_workload"}},
	{"P99 latency by workload", latencyQuery(0.99), []string{"source_workload", "destination_workload"}},
	{"request size by workload", `histogram_quantile(0.50, sum(irate(istio_request_bytes_bucket{reporter="source"}[1m])) by (source_workload, destination_workload, le))`,
		[]string{"source_workload", "destination_workload"}},
	{"response size by workload", `histogram_quantile(0.99, sum(irate(istio_response_bytes_bucket{reporter="source"}[1m])) by (source_workload, destination_workload, le))`,
		[]string{"source_workload", "destination_workload"}},
	{"incoming success rate by service", `sum(irate(istio_requests_total{reporter="destination", response_code!~"5.*"}[1m])) by (destination_service) / sum(irate(istio_requests_total{reporter="destination"}[1m])) by (destination_service)`,
		[]string{"destination_service"}},
	{"TCP bytes received by destination workload", `sum(irate(istio_tcp_received_bytes_total{reporter="destination"}[1m])) by (destination_workload, destination_workload_namespace)`,
		[]string{"destination_workload"}},
	{"TCP bytes sent by source workload and service", `sum(irate(istio_tcp_sent_bytes_total{reporter="source"}[1m])) by (source_workload, destination_service)`,
		[]string{"source_workload", "destination_service"}},
	{"TCP connections opened by destination workload", `sum(irate(istio_tcp_connections_opened_total{reporter="destination"}[1m])) by (destination_workload)`,
		[]string{"destination_workload"}},
	{"pilot pushes by type", `sum(irate(pilot_xds_pushes[1m])) by (type)`, []string{"type"}},
	{"pilot connected proxies", `sum(pilot_xds{app="istiod"})`, nil},
	{"pilot proxy convergence P99", `histogram_quantile(0.99, sum(rate(pilot_proxy_convergence_time_bucket[1m])) by (le))`, nil},
	{"pilot push time P50", `histogram_quantile(0.5, sum(rate(pilot_xds_push_time_bucket[1m])) by (le))`, nil},
}

func latencyQuery(q float64) string {
	return fmt.Sprintf(`histogram_quantile(%v, sum(irate(istio_request_duration_milliseconds_bucket{reporter="source"}[1m])) by (source_workload, destination_workload, le))`, q)
}

// The sample mesh's metrics in a real Prometheus: it scrapes every pod's merged page and
// discovery's /metrics (every target up), and each query of Istio's dashboards that the
// mesh has data for returns series with the labels the dashboards group by.
func TestPrometheusAnswersIstioDashboards(t *testing.T) {
	m, ctx, prom := sampleMeshWithPrometheus(t, 50)

	require.Eventually(t, func() bool {
		ts, err := prom.ActiveTargets(ctx)
		if err != nil || len(ts) != len(m.Pods())+1 {
			return false
		}
		for _, h := range ts {
			if h != "up" {
				return false
			}
		}
		return true
	}, time.Minute, 250*time.Millisecond, "every pod and discovery scraped")
	// A config change once Prometheus has seen discovery's counters: the push and the
	// proxies' convergence land inside the dashboards' rate windows.
	require.Eventually(t, func() bool {
		got, err := prom.Query(ctx, `count_over_time(up{job="pilot"}[1m])`)
		return err == nil && len(got) == 1 && got[0].Value >= 2
	}, time.Minute, 250*time.Millisecond, "discovery scraped twice")
	require.NoError(t, m.WriteConfig("zz-extra.yaml", meshtest.ServiceEntry("extra", 9999, 9999)))

	for _, q := range dashboardQueries {
		var got []promserver.Sample
		var qerr error
		ok := assert.Eventually(t, func() bool {
			got, qerr = prom.Query(ctx, q.expr)
			return qerr == nil && len(got) > 0 && hasLabels(got, q.labels) && finite(got)
		}, time.Minute, 500*time.Millisecond, "%s: %s", q.name, q.expr)
		if !ok {
			t.Logf("%s: last answer %v, error %v", q.name, got, qerr)
			continue
		}
		t.Logf("%s: %d series, e.g. %v = %g", q.name, len(got), got[0].Labels, got[0].Value)
	}
	// promtool's lint on every page: only what Istio's and Envoy's own pages give too.
	for _, p := range m.Pods() {
		page, err := p.Scrape(ctx)
		require.NoError(t, err)
		requireOnlySharedFindings(t, p.Spec.Name, promtoolProblems(t, page))
	}
	dpage, err := getURL(m.DiscoveryURL("/metrics"))
	require.NoError(t, err)
	requireOnlySharedFindings(t, "discovery", promtoolProblems(t, dpage))
	// The labels carry the workloads the sample calls: productpage -> reviews.
	edges, err := prom.Query(ctx, `sum(istio_requests_total{reporter="source"}) by (source_workload, destination_workload)`)
	require.NoError(t, err)
	var names []string
	for _, e := range edges {
		names = append(names, e.Labels["source_workload"]+"->"+e.Labels["destination_workload"])
	}
	assert.Contains(t, names, "productpage-v1->reviews-v1", "edges: %v", names)
	assert.Contains(t, names, "reviews-v2->ratings-v1", "edges: %v", names)
	// ratings keeps its data in mongodb over TCP: its connections, as mongodb's sidecar
	// reports them, and the service as ratings' sidecar does.
	tcp, err := prom.Query(ctx, `sum(istio_tcp_connections_closed_total) by (reporter, source_workload, destination_workload, destination_service)`)
	require.NoError(t, err)
	var conns []string
	for _, e := range tcp {
		conns = append(conns, e.Labels["reporter"]+":"+e.Labels["source_workload"]+"->"+e.Labels["destination_workload"]+"/"+e.Labels["destination_service"])
	}
	assert.Contains(t, conns, "destination:unknown->mongodb-v1/unknown", "tcp: %v", conns)
	assert.Contains(t, conns, "source:ratings-v1->unknown/mongodb.default.svc.cluster.local", "tcp: %v", conns)
}

// finite says whether every value is a number: a histogram quantile or a ratio over a
// window without observations is NaN, which a dashboard draws as no data.
func finite(samples []promserver.Sample) bool {
	for _, s := range samples {
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			return false
		}
	}
	return true
}

func hasLabels(samples []promserver.Sample, labels []string) bool {
	for _, s := range samples {
		for _, l := range labels {
			if s.Labels[l] == "" {
				return false
			}
		}
	}
	return true
}

// sampleMeshWithPrometheus starts the sample mesh with steady load at rate to its front end
// and a Prometheus scraping it every second.
func sampleMeshWithPrometheus(t *testing.T, rate float64) (*localmesh.Mesh, context.Context, *promserver.Server) {
	t.Helper()
	if _, err := promserver.Find(""); err != nil {
		if meshtest.RequireFixtures() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	m, ctx := startMesh(t, sampleConfig(t))
	front := addBookinfo(t, ctx, m)
	opts := m.PrometheusOptions()
	opts.ScrapeInterval = time.Second
	prom, err := promserver.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(prom.Close)
	go prom.Follow(ctx, time.Second, m.ScrapeTargets)
	load := meshtest.SteadyLoad(t, ctx, front.URL("/"), rate)
	t.Cleanup(func() { load.Stop() })
	return m, ctx, prom
}

// addBookinfo starts the sample's pods and returns the front end.
func addBookinfo(t *testing.T, ctx context.Context, m *localmesh.Mesh) *localmesh.Pod {
	t.Helper()
	var front *localmesh.Pod
	for _, spec := range localmesh.Bookinfo() {
		p, err := m.AddPod(ctx, spec)
		require.NoError(t, err)
		if spec.Labels["app"] == "productpage" {
			front = p
		}
	}
	require.NotNil(t, front)
	return front
}

// sharedFindings are the promtool findings that Envoy's and Istio's own pages give as
// well, by metric name prefix: Envoy writes no HELP on /stats/prometheus (envoy_*, and the
// filters' istio_* and wasmesh_* stats, which the proxy exports) and names counters
// without "_total" (envoy_cluster_membership_total is its gauge); istiod and pilot-agent
// name their counters without the suffix too (pilot_*, citadel_*_count, istiod_*,
// xds_proxy_*), and Istio's latency histogram is in milliseconds.
var sharedFindings = []struct{ prefix, problem string }{
	{"envoy_", "no help text"},
	{"istio_", "no help text"},
	{"wasmesh_", "no help text"},
	{"envoy_", `counter metrics should have "_total" suffix`},
	{"envoy_cluster_membership_total", `non-counter metrics should not have "_total" suffix`},
	{"pilot_", `counter metrics should have "_total" suffix`},
	{"citadel_server_", `counter metrics should have "_total" suffix`},
	{"citadel_server_", `non-histogram and non-summary metrics should not have "_count" suffix`},
	{"istiod_", `counter metrics should have "_total" suffix`},
	{"xds_proxy_", `counter metrics should have "_total" suffix`},
	{"istio_request_duration_milliseconds", `use base unit "seconds" instead of "milliseconds"`},
}

func requireOnlySharedFindings(t *testing.T, page string, findings []string) {
	t.Helper()
	shared := 0
	for _, f := range findings {
		name, problem, _ := strings.Cut(f, " ")
		ok := false
		for _, s := range sharedFindings {
			ok = ok || strings.HasPrefix(name, s.prefix) && problem == s.problem
		}
		if !ok {
			assert.Fail(t, "promtool finding that Istio's and Envoy's pages do not give", "%s: %s", page, f)
			continue
		}
		shared++
	}
	t.Logf("promtool on %s: %d findings, all shared with Envoy's or Istio's own pages", page, shared)
}

// promtoolProblems runs `promtool check metrics` on a page and returns its findings, one per
// line ("<metric> <problem>").
func promtoolProblems(t *testing.T, page []byte) []string {
	t.Helper()
	out, err := promserver.CheckMetrics(context.Background(), page)
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}
