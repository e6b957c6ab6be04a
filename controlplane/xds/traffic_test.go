package xds_test

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	previoushosts "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// The tests in this file check the semantics of the generated configuration: that what a
// VirtualService or DestinationRule asks for lands in the fields Envoy reads.

const reviewsSE = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, targetPort: 8080}]
  endpoints:
  - {address: 10.1.0.1, labels: {version: v1}}
  - {address: 10.1.0.2, labels: {version: v2}}
  - {address: 10.1.0.3, labels: {version: v2}}
`

const reviewsSubsets = `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
`

// viewOf builds a snapshot from configs and returns a proxy's view of it.
func viewOf(t *testing.T, yaml string, md map[string]any) *xds.View {
	t.Helper()
	return viewIn(t, snapshotOf(t, yaml), md)
}

// snapshotOf builds a snapshot from configs.
func snapshotOf(t *testing.T, yaml string) *xds.Snapshot {
	t.Helper()
	var cs []*config.Config
	for _, d := range config.ParseFile("test.yaml", []byte(yaml)) {
		require.Nil(t, d.Err, "%v", d.Err)
		cs = append(cs, d.Config)
	}
	reg := registry.NewServiceEntries(slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New(prometheus.NewRegistry()))
	reg.SetConfigs(cs)
	return xds.NewSnapshot(push.Build("test", mesh.Default(), config.NewIndex(cs), registry.NewAggregate(reg)))
}

// viewIn is a proxy's view of snap: a sidecar in namespace shop labelled app=client
// unless md says otherwise.
func viewIn(t *testing.T, snap *xds.Snapshot, md map[string]any) *xds.View {
	t.Helper()
	if md == nil {
		md = map[string]any{"NAMESPACE": "shop", "LABELS": map[string]any{"app": "client"}}
	}
	s, err := structpb.NewStruct(md)
	require.NoError(t, err)
	ns, _ := md["NAMESPACE"].(string)
	p, err := model.ParseNode(&core.Node{Id: "sidecar~10.2.0.1~client-1." + ns + "~" + ns + ".svc.cluster.local", Metadata: s})
	require.NoError(t, err)
	return xds.NewView(snap, p)
}

func routeConfig(t *testing.T, v *xds.View, name string) *route.RouteConfiguration {
	t.Helper()
	rs := xds.Routes(v, []string{name})
	require.Len(t, rs, 1, "route configuration %s", name)
	return rs[0].Message.(*route.RouteConfiguration)
}

func vhost(t *testing.T, rc *route.RouteConfiguration, name string) *route.VirtualHost {
	t.Helper()
	for _, vh := range rc.GetVirtualHosts() {
		if vh.GetName() == name {
			return vh
		}
	}
	t.Fatalf("no virtual host %s in %s", name, rc.GetName())
	return nil
}

func clusterOf(t *testing.T, v *xds.View, name string) *cluster.Cluster {
	t.Helper()
	r := xds.Clusters(v).Find(name)
	require.NotNil(t, r, "cluster %s", name)
	return r.Message.(*cluster.Cluster)
}

func endpointsOf(t *testing.T, v *xds.View, name string) []string {
	t.Helper()
	rs := xds.Endpoints(v, []string{name})
	require.Len(t, rs, 1, "assignment %s", name)
	var out []string
	for _, le := range rs[0].Message.(*endpoint.ClusterLoadAssignment).GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			out = append(out, lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
	}
	return out
}

func TestWeightsLandInWeightedClustersOfSubsetClusters(t *testing.T) {
	v := viewOf(t, reviewsSE+reviewsSubsets+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http:
  - route:
    - {destination: {host: reviews.shop.svc.cluster.local, subset: v1}, weight: 80}
    - {destination: {host: reviews.shop.svc.cluster.local, subset: v2}, weight: 20}
`, nil)
	r := vhost(t, routeConfig(t, v, "9080"), "reviews.shop.svc.cluster.local:9080").GetRoutes()[0]
	wc := r.GetRoute().GetWeightedClusters().GetClusters()
	require.Len(t, wc, 2)
	assert.Equal(t, "outbound|9080|v1|reviews.shop.svc.cluster.local", wc[0].GetName())
	assert.Equal(t, uint32(80), wc[0].GetWeight().GetValue())
	assert.Equal(t, "outbound|9080|v2|reviews.shop.svc.cluster.local", wc[1].GetName())
	assert.Equal(t, uint32(20), wc[1].GetWeight().GetValue())

	// Each subset is its own EDS cluster whose assignment holds only the subset's endpoints.
	for subset, want := range map[string][]string{"v1": {"10.1.0.1"}, "v2": {"10.1.0.2", "10.1.0.3"}, "": {"10.1.0.1", "10.1.0.2", "10.1.0.3"}} {
		name := xds.OutboundClusterName(9080, subset, "reviews.shop.svc.cluster.local")
		c := clusterOf(t, v, name)
		assert.Equal(t, cluster.Cluster_EDS, c.GetType())
		assert.Equal(t, name, c.GetEdsClusterConfig().GetServiceName())
		assert.Equal(t, want, endpointsOf(t, v, name), subset)
	}
}

func TestDefaultRetryPolicyAsIstioGeneratesIt(t *testing.T) {
	v := viewOf(t, reviewsSE, nil)
	r := vhost(t, routeConfig(t, v, "9080"), "reviews.shop.svc.cluster.local:9080").GetRoutes()[0]
	rp := r.GetRoute().GetRetryPolicy()
	require.NotNil(t, rp, "routes without a VirtualService retry by default")
	assert.Equal(t, uint32(2), rp.GetNumRetries().GetValue())
	assert.Equal(t, "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", rp.GetRetryOn())
	assert.Equal(t, []uint32{503}, rp.GetRetriableStatusCodes())
	assert.Equal(t, int64(5), rp.GetHostSelectionRetryMaxAttempts())
	require.Len(t, rp.GetRetryHostPredicate(), 1)
	assert.Equal(t, "envoy.retry_host_predicates.previous_hosts", rp.GetRetryHostPredicate()[0].GetName())
	assert.NoError(t, rp.GetRetryHostPredicate()[0].GetTypedConfig().UnmarshalTo(&previoushosts.PreviousHostsPredicate{}))
	assert.Zero(t, r.GetRoute().GetTimeout().AsDuration(), "no timeout unless a VirtualService sets one")

	// The same default applies to VirtualService routes without retries.
	v = viewOf(t, reviewsSE+reviewsSubsets+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http: [{route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v1}}]}]
`, nil)
	r = vhost(t, routeConfig(t, v, "9080"), "reviews.shop.svc.cluster.local:9080").GetRoutes()[0]
	assert.Equal(t, uint32(2), r.GetRoute().GetRetryPolicy().GetNumRetries().GetValue())
}

func TestRetriesTimeoutsAndFaultsLandWhereEnvoyReadsThem(t *testing.T) {
	v := viewOf(t, reviewsSE+reviewsSubsets+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http:
  - match: [{uri: {prefix: /retry}}]
    timeout: 3s
    retries: {attempts: 3, perTryTimeout: 500ms, retryOn: "5xx,429"}
    route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v2}}]
  - match: [{uri: {prefix: /once}}]
    retries: {attempts: 0}
    route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v2}}]
  - fault:
      abort: {httpStatus: 418, percentage: {value: 50}}
      delay: {fixedDelay: 2s, percentage: {value: 0.5}}
    route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v1}}]
`, nil)
	routes := vhost(t, routeConfig(t, v, "9080"), "reviews.shop.svc.cluster.local:9080").GetRoutes()
	require.Len(t, routes, 3)

	retry := routes[0].GetRoute()
	assert.Equal(t, 3*time.Second, retry.GetTimeout().AsDuration())
	assert.Equal(t, 3*time.Second, retry.GetMaxGrpcTimeout().AsDuration()) //nolint:staticcheck // Istio sets it
	rp := retry.GetRetryPolicy()
	assert.Equal(t, uint32(3), rp.GetNumRetries().GetValue())
	assert.Equal(t, 500*time.Millisecond, rp.GetPerTryTimeout().AsDuration())
	assert.Equal(t, "5xx,retriable-status-codes", rp.GetRetryOn())
	assert.Equal(t, []uint32{429}, rp.GetRetriableStatusCodes())

	assert.Nil(t, routes[1].GetRoute().GetRetryPolicy(), "attempts: 0 disables retries")

	var hf fault.HTTPFault
	require.NoError(t, routes[2].GetTypedPerFilterConfig()[xds.FaultFilter].UnmarshalTo(&hf))
	assert.Equal(t, uint32(418), hf.GetAbort().GetHttpStatus())
	assert.Equal(t, &typev3.FractionalPercent{Numerator: 500000, Denominator: typev3.FractionalPercent_MILLION}, hf.GetAbort().GetPercentage())
	assert.Equal(t, 2*time.Second, hf.GetDelay().GetFixedDelay().AsDuration())
	assert.Equal(t, &typev3.FractionalPercent{Numerator: 5000, Denominator: typev3.FractionalPercent_MILLION}, hf.GetDelay().GetPercentage())

	// The per-route fault config only works with the fault filter in the connection manager,
	// ahead of the router.
	l := xds.Listeners(v).Find("0.0.0.0_9080").Message.(*listener.Listener)
	var m hcm.HttpConnectionManager
	require.NoError(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&m))
	var names []string
	for _, f := range m.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	assert.Equal(t, []string{xds.FaultFilter, xds.CorsFilter, xds.RouterFilter}, names)
}

func TestOutlierDetectionAndCircuitBreakersLandWhereEnvoyReadsThem(t *testing.T) {
	v := viewOf(t, reviewsSE+`---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  trafficPolicy:
    loadBalancer: {simple: LEAST_REQUEST}
    connectionPool:
      tcp: {maxConnections: 10, connectTimeout: 250ms}
      http: {http1MaxPendingRequests: 1, http2MaxRequests: 5, maxRetries: 2, maxRequestsPerConnection: 1}
    outlierDetection: {consecutive5xxErrors: 3, interval: 2s, baseEjectionTime: 1m, maxEjectionPercent: 100}
  subsets:
  - {name: v1, labels: {version: v1}}
  - name: v2
    labels: {version: v2}
    trafficPolicy: {outlierDetection: {consecutiveGatewayErrors: 1, interval: 1s}}
`, nil)
	for _, name := range []string{"outbound|9080||reviews.shop.svc.cluster.local", "outbound|9080|v1|reviews.shop.svc.cluster.local"} {
		c := clusterOf(t, v, name)
		od := c.GetOutlierDetection()
		require.NotNil(t, od, name)
		assert.Equal(t, uint32(3), od.GetConsecutive_5Xx().GetValue())
		assert.Equal(t, uint32(100), od.GetEnforcingConsecutive_5Xx().GetValue())
		assert.Equal(t, uint32(0), od.GetEnforcingSuccessRate().GetValue(), "success-rate ejection is off")
		assert.Equal(t, 2*time.Second, od.GetInterval().AsDuration())
		assert.Equal(t, time.Minute, od.GetBaseEjectionTime().AsDuration())
		assert.Equal(t, uint32(100), od.GetMaxEjectionPercent().GetValue())
		assert.Equal(t, float64(0), c.GetCommonLbConfig().GetHealthyPanicThreshold().GetValue(), "panic mode off")
		th := c.GetCircuitBreakers().GetThresholds()[0]
		assert.Equal(t, uint32(10), th.GetMaxConnections().GetValue())
		assert.Equal(t, uint32(1), th.GetMaxPendingRequests().GetValue())
		assert.Equal(t, uint32(5), th.GetMaxRequests().GetValue())
		assert.Equal(t, uint32(2), th.GetMaxRetries().GetValue())
		assert.Equal(t, 250*time.Millisecond, c.GetConnectTimeout().AsDuration())
		assert.Equal(t, cluster.Cluster_LEAST_REQUEST, c.GetLbPolicy())
	}
	// A subset's outlier detection replaces the rule's; the rest is inherited.
	c := clusterOf(t, v, "outbound|9080|v2|reviews.shop.svc.cluster.local")
	assert.Nil(t, c.GetOutlierDetection().GetConsecutive_5Xx())
	assert.Equal(t, uint32(1), c.GetOutlierDetection().GetConsecutiveGatewayFailure().GetValue())
	assert.Equal(t, uint32(100), c.GetOutlierDetection().GetEnforcingConsecutiveGatewayFailure().GetValue())
	assert.Equal(t, uint32(10), c.GetCircuitBreakers().GetThresholds()[0].GetMaxConnections().GetValue())
}

func TestConsistentHashPutsTheKeyOnTheRoute(t *testing.T) {
	v := viewOf(t, reviewsSE+`---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
`, nil)
	c := clusterOf(t, v, "outbound|9080||reviews.shop.svc.cluster.local")
	assert.Equal(t, cluster.Cluster_RING_HASH, c.GetLbPolicy())
	r := vhost(t, routeConfig(t, v, "9080"), "reviews.shop.svc.cluster.local:9080").GetRoutes()[0]
	require.Len(t, r.GetRoute().GetHashPolicy(), 1)
	assert.Equal(t, "x-user", r.GetRoute().GetHashPolicy()[0].GetHeader().GetHeaderName())
}

func TestDestinationRuleLookupPrefersTheClientNamespace(t *testing.T) {
	cfg := reviewsSE + reviewsSubsets + `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews-from-web, namespace: web}
spec:
  host: reviews.shop.svc.cluster.local
  trafficPolicy: {loadBalancer: {simple: RANDOM}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews-selected, namespace: web}
spec:
  host: reviews.shop.svc.cluster.local
  workloadSelector: {matchLabels: {app: special}}
  trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: private, namespace: shop}
spec:
  host: "*.shop.svc.cluster.local"
  exportTo: ["."]
  trafficPolicy: {loadBalancer: {simple: PASSTHROUGH}}
`
	name := "outbound|9080||reviews.shop.svc.cluster.local"
	// The service's namespace has two rules; the exact host wins over the wildcard.
	assert.Equal(t, cluster.Cluster_LEAST_REQUEST, clusterOf(t, viewOf(t, cfg, nil), name).GetLbPolicy())
	// A client namespace's own rule wins over the service namespace's.
	web := map[string]any{"NAMESPACE": "web", "LABELS": map[string]any{"app": "web"}}
	assert.Equal(t, cluster.Cluster_RANDOM, clusterOf(t, viewOf(t, cfg, web), name).GetLbPolicy())
	// A rule selecting the client by labels wins over its namespace's plain rule.
	special := map[string]any{"NAMESPACE": "web", "LABELS": map[string]any{"app": "special"}}
	assert.Equal(t, cluster.Cluster_ROUND_ROBIN, clusterOf(t, viewOf(t, cfg, special), name).GetLbPolicy())
	// A rule exported only to its own namespace is invisible elsewhere.
	other := map[string]any{"NAMESPACE": "other"}
	assert.Equal(t, cluster.Cluster_LEAST_REQUEST, clusterOf(t, viewOf(t, cfg, other), name).GetLbPolicy())
}

// Clients of one snapshot each get the default routes of their own view: the short names
// of their own namespace, and the hash key of the DestinationRule they see (generated
// pieces are shared between clients only where these agree).
func TestDefaultRoutesFollowEachClientInOneSnapshot(t *testing.T) {
	snap := snapshotOf(t, reviewsSE+`---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews-special, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  workloadSelector: {matchLabels: {app: special}}
  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
`)
	client := func(ns, app string) map[string]any {
		return map[string]any{"NAMESPACE": ns, "LABELS": map[string]any{"app": app}}
	}
	for _, c := range []struct {
		md        map[string]any
		shortName bool
		hash      int
	}{
		{client("shop", "client"), true, 0},
		{client("web", "client"), false, 0},  // another namespace
		{client("shop", "special"), true, 1}, // another rule
		{client("shop", "client"), true, 0},
	} {
		vh := vhost(t, routeConfig(t, viewIn(t, snap, c.md), "9080"), "reviews.shop.svc.cluster.local:9080")
		assert.Equal(t, c.shortName, slices.Contains(vh.GetDomains(), "reviews"), "%v: domains %v", c.md, vh.GetDomains())
		assert.Len(t, vh.GetRoutes()[0].GetRoute().GetHashPolicy(), c.hash, "%v", c.md)
	}
}

func TestSidecarScopesClustersRoutesListenersAndEndpoints(t *testing.T) {
	cfg := reviewsSE + `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: other}
spec:
  hosts: [ratings.other.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7070, name: http, targetPort: 8080}]
  endpoints: [{address: 10.9.0.1}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./*"]}]
`
	scoped := viewOf(t, cfg, nil)
	unscoped := viewOf(t, cfg, map[string]any{"NAMESPACE": "web"})
	ratings := "outbound|7070||ratings.other.svc.cluster.local"

	assert.Nil(t, xds.Clusters(scoped).Find(ratings), "a service outside the egress hosts has no cluster")
	assert.NotNil(t, xds.Clusters(unscoped).Find(ratings))
	assert.Empty(t, xds.Endpoints(scoped, []string{ratings}), "nor endpoints, even when asked for by name")
	assert.Len(t, xds.Endpoints(unscoped, []string{ratings}), 1)
	assert.Equal(t, []string{"9080"}, xds.RouteNames(scoped))
	assert.Equal(t, []string{"7070", "9080"}, xds.RouteNames(unscoped))
	assert.Empty(t, xds.Routes(scoped, []string{"7070"}))
	assert.Nil(t, xds.Listeners(scoped).Find("0.0.0.0_7070"))
	assert.NotNil(t, xds.Listeners(unscoped).Find("0.0.0.0_7070"))
	assert.NotNil(t, xds.Clusters(scoped).Find("outbound|9080||reviews.shop.svc.cluster.local"))
}

func TestProxylessGRPCResourcesByName(t *testing.T) {
	cfg := reviewsSE + reviewsSubsets
	client := viewOf(t, cfg, map[string]any{"NAMESPACE": "shop", "GENERATOR": "grpc"})
	require.True(t, client.IsGRPC())

	// Listeners by the names a client dials, short ones completed in its domain.
	lds := xds.Generate(client, xds.ListenerType, []string{"reviews:9080", "reviews.shop.svc.cluster.local:9080", "nothing:1"})
	assert.Equal(t, []string{"reviews.shop.svc.cluster.local:9080", "reviews:9080"}, lds.Names())
	l := lds.Items[0].Message.(*listener.Listener)
	var m hcm.HttpConnectionManager
	require.NoError(t, l.GetApiListener().GetApiListener().UnmarshalTo(&m))
	assert.Equal(t, "outbound|9080||reviews.shop.svc.cluster.local", m.GetRds().GetRouteConfigName())

	rds := xds.Generate(client, xds.RouteType, []string{"outbound|9080||reviews.shop.svc.cluster.local"})
	require.Len(t, rds.Items, 1)
	vh := rds.Items[0].Message.(*route.RouteConfiguration).GetVirtualHosts()
	require.Len(t, vh, 1, "no catch-all virtual host for gRPC")
	assert.NotNil(t, vh[0].GetRoutes()[0].GetRoute().GetMaxStreamDuration(), "gRPC reads the timeout from max_stream_duration")

	cds := xds.Generate(client, xds.ClusterType, []string{"outbound|9080|v1|reviews.shop.svc.cluster.local", "outbound|9080|v9|reviews.shop.svc.cluster.local"})
	assert.Equal(t, []string{"outbound|9080|v1|reviews.shop.svc.cluster.local"}, cds.Names(), "only what exists")
	c := cds.Items[0].Message.(*cluster.Cluster)
	assert.Equal(t, cluster.Cluster_ROUND_ROBIN, c.GetLbPolicy())
	assert.Nil(t, c.GetCircuitBreakers(), "gRPC clusters stay lean")

	// A gRPC server gets an inbound listener for a port its services give it, nothing else.
	server := viewOf(t, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9090, name: grpc, targetPort: 8090}]
  workloadSelector: {labels: {app: ratings}}
`, map[string]any{"NAMESPACE": "shop", "GENERATOR": "grpc", "LABELS": map[string]any{"app": "ratings"}})
	in := xds.Generate(server, xds.ListenerType, []string{xds.GRPCInboundListenerPrefix + "10.2.0.1:8090", xds.GRPCInboundListenerPrefix + "10.2.0.1:9999"})
	require.Equal(t, []string{xds.GRPCInboundListenerPrefix + "10.2.0.1:8090"}, in.Names())
	require.NoError(t, in.Items[0].Message.(*listener.Listener).ValidateAll())
}

// A DestinationRule's TCP idle timeout and maximum connection duration land on the outbound
// tcp_proxy each on its own (Istio's tcp_proxy idle_timeout and
// max_downstream_connection_duration); without either the tcp_proxy has neither.
func TestTCPConnectionPoolTimesLandOnTheTCPProxy(t *testing.T) {
	for _, tc := range []struct {
		tcp            string
		idle, duration time.Duration
	}{
		{"{idleTimeout: 90s, maxConnectionDuration: 1h}", 90 * time.Second, time.Hour},
		{"{idleTimeout: 90s}", 90 * time.Second, 0},
		{"{maxConnectionDuration: 1h}", 0, time.Hour},
		{"{connectTimeout: 5s}", 0, 0},
	} {
		t.Run(tc.tcp, func(t *testing.T) {
			v := viewOf(t, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: shop}
spec:
  hosts: [db.shop.svc.cluster.local]
  addresses: [10.96.0.5]
  resolution: STATIC
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  endpoints: [{address: 10.1.5.1}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: db, namespace: shop}
spec:
  host: db.shop.svc.cluster.local
  trafficPolicy: {connectionPool: {tcp: `+tc.tcp+`}}
`, nil)
			l := xds.Listeners(v).Find("0.0.0.0_5432").Message.(*listener.Listener)
			require.NoError(t, l.ValidateAll())
			var tp tcpproxy.TcpProxy
			require.NoError(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&tp))
			require.NoError(t, tp.ValidateAll())
			assert.Equal(t, "outbound|5432||db.shop.svc.cluster.local", tp.GetCluster())
			assert.Equal(t, tc.idle, tp.GetIdleTimeout().AsDuration())
			assert.Equal(t, tc.idle != 0, tp.GetIdleTimeout() != nil)
			assert.Equal(t, tc.duration, tp.GetMaxDownstreamConnectionDuration().AsDuration())
			assert.Equal(t, tc.duration != 0, tp.GetMaxDownstreamConnectionDuration() != nil)
		})
	}
}

// Each form of Sidecar egress host imports what it names: an exact host in a namespace or
// in any, a namespace's wildcard (honouring exportTo), a wildcard host pattern.
// staticSE is a ServiceEntry document for host on port 80 with one endpoint; extra adds
// spec fields.
func staticSE(name, ns, host, extra string) string {
	return `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ` + name + `, namespace: ` + ns + `}
spec:
  hosts: ["` + host + `"]
  resolution: STATIC
  ports: [{number: 80, name: http}]
  endpoints: [{address: 10.0.0.1}]
` + extra
}

func TestSidecarEgressHostsImportWhatTheyName(t *testing.T) {
	se := staticSE
	cfg := se("a", "shop", "a.shop.svc.cluster.local", "") + se("b", "shop", "b.shop.svc.cluster.local", "") +
		se("c", "other", "c.other.svc.cluster.local", "") + se("d", "other", "d.other.svc.cluster.local", "  exportTo: [.]\n") +
		se("e", "third", "e.third.svc.cluster.local", "") + se("f", "third", "f.third.svc.cluster.local", "") +
		se("wild", "ext", "*.wild.example", "  location: MESH_EXTERNAL\n") + `---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./a.shop.svc.cluster.local", "other/*", "*/e.third.svc.cluster.local", "ext/*.example"]}]
`
	v := viewOf(t, cfg, nil)
	for host, want := range map[string]bool{
		"a.shop.svc.cluster.local": true, "b.shop.svc.cluster.local": false,
		"c.other.svc.cluster.local": true, "d.other.svc.cluster.local": false,
		"e.third.svc.cluster.local": true, "f.third.svc.cluster.local": false,
		"*.wild.example": true,
	} {
		assert.Equal(t, want, xds.Clusters(v).Find("outbound|80||"+host) != nil, host)
	}
}

// A push of services only asks every proxy shape whether it reaches a changed host, with
// the scope built before the change: Scope.Reaches must answer what a scope built on the
// new snapshot does, for new services its egress hosts name or not, one its
// VirtualService routes to, and one whose exportTo hides it.
func TestScopeReachesAnswersAsAScopeBuiltOnTheNewSnapshot(t *testing.T) {
	se := func(name, ns, extra string) string {
		return staticSE(name, ns, name+"."+ns+".svc.cluster.local", extra)
	}
	traffic := `---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./a.shop.svc.cluster.local", "other/*", "gw/front.gw.svc.cluster.local"]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: front, namespace: gw}
spec:
  hosts: [front.gw.svc.cluster.local]
  http: [{route: [{destination: {host: back.third.svc.cluster.local}}]}]
`
	before := se("a", "shop", "") + se("c", "other", "") + se("front", "gw", "") + traffic
	after := before + se("b", "shop", "") + se("d", "other", "") + se("hidden", "other", "  exportTo: [.]\n") +
		se("back", "third", "") + se("f", "third", "")
	md := map[string]any{"NAMESPACE": "shop", "LABELS": map[string]any{"app": "client"}}
	old, rebuilt := viewOf(t, before, md), viewOf(t, after, md)
	want := map[string]bool{
		"a.shop.svc.cluster.local": true, "b.shop.svc.cluster.local": false, "c.other.svc.cluster.local": true,
		"d.other.svc.cluster.local": true, "hidden.other.svc.cluster.local": false, "front.gw.svc.cluster.local": true,
		"back.third.svc.cluster.local": true, "f.third.svc.cluster.local": false, "none.shop.svc.cluster.local": false,
	}
	for host, reached := range want {
		assert.Equal(t, reached, rebuilt.Scope.Service(host) != nil || rebuilt.Scope.RoutesHost(host), "scope built on the new snapshot, %s", host)
		assert.Equal(t, reached, old.Scope.Reaches(rebuilt.Snapshot, host), "earlier scope asked of the new snapshot, %s", host)
	}
}

// A route whose every match names sourceLabels exists only for the proxies those labels
// select (Istio's sourceMatchHTTP): proxies of one namespace differing only by labels get
// their own routes.
func TestSourceLabelsAloneMakeRoutesPerWorkload(t *testing.T) {
	snap := snapshotOf(t, reviewsSE+reviewsSubsets+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http:
  - match: [{sourceLabels: {app: tester}}]
    route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v1}}]
  - route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v2}}]
`)
	clusters := func(app string) []string {
		v := viewIn(t, snap, map[string]any{"NAMESPACE": "shop", "LABELS": map[string]any{"app": app}})
		rc := routeConfig(t, v, "9080")
		require.NoError(t, rc.ValidateAll())
		var out []string
		for _, r := range vhost(t, rc, "reviews.shop.svc.cluster.local:9080").GetRoutes() {
			out = append(out, r.GetRoute().GetCluster())
		}
		return out
	}
	// For the tester the first route matches everything, so it is the last (as Istio's
	// catch-all route ends the list).
	assert.Equal(t, []string{"outbound|9080|v1|reviews.shop.svc.cluster.local"}, clusters("tester"))
	assert.Equal(t, []string{"outbound|9080|v2|reviews.shop.svc.cluster.local"}, clusters("client"))
	assert.Equal(t, []string{"outbound|9080|v1|reviews.shop.svc.cluster.local"}, clusters("tester"))
}

// Of two DestinationRules in the proxy's namespace whose workload selectors both select it,
// for the same host, the first (by name) applies, as in Istio's SidecarScope.DestinationRule
// (the first rule whose selector matches); alike for an exact host and for a wildcard.
func TestOfTwoSelectingRulesForOneHostTheFirstApplies(t *testing.T) {
	for _, host := range []string{"reviews.shop.svc.cluster.local", "*.shop.svc.cluster.local"} {
		t.Run(host, func(t *testing.T) {
			rule := func(name, selector string, maxConns int) string {
				return fmt.Sprintf(`---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: %s, namespace: shop}
spec:
  host: "%s"
  workloadSelector: {matchLabels: {%s}}
  trafficPolicy: {connectionPool: {tcp: {maxConnections: %d}}}
`, name, host, selector, maxConns)
			}
			v := viewOf(t, reviewsSE+rule("a-first", "app: client", 1)+rule("b-second", "version: v1", 2),
				map[string]any{"NAMESPACE": "shop", "LABELS": map[string]any{"app": "client", "version": "v1"}})
			c := clusterOf(t, v, "outbound|9080||reviews.shop.svc.cluster.local")
			require.NoError(t, c.ValidateAll())
			assert.Equal(t, uint32(1), c.GetCircuitBreakers().GetThresholds()[0].GetMaxConnections().GetValue())
		})
	}
}
