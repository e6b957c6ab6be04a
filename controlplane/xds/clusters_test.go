package xds_test

import (
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// A proxy whose Sidecar imports no service still gets a cluster for each of its inbound
// ports (here more of them than it has outbound clusters), and the black-hole and
// passthrough clusters (inbound passthrough too: it redirects inbound traffic).
func TestClustersOfAProxyThatReachesNothing(t *testing.T) {
	v := viewOf(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: client, namespace: shop}
spec:
  hosts: [client.shop.svc.cluster.local]
  resolution: STATIC
  workloadSelector: {labels: {app: client}}
  ports: [{number: 80, name: http-a}, {number: 81, name: http-b}, {number: 82, name: http-c}, {number: 83, name: http-d}, {number: 84, name: http-e}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec: {egress: [{hosts: ["elsewhere/nothing.example"]}]}
`, nil)
	assert.Equal(t, []string{xds.BlackHoleCluster, xds.InboundPassthroughCluster, xds.PassthroughCluster, "inbound|80||", "inbound|81||", "inbound|82||", "inbound|83||", "inbound|84||"},
		xds.Clusters(v).Names())
}

// A DestinationRule in the root namespace (istio-system) applies where neither the client's
// namespace nor the service's has one, for clients in the service's namespace too.
func TestRootNamespaceDestinationRuleIsTheLastResort(t *testing.T) {
	cfg := reviewsSE + `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews-mesh, namespace: istio-system}
spec:
  host: reviews.shop.svc.cluster.local
  trafficPolicy: {loadBalancer: {simple: RANDOM}}
`
	name := "outbound|9080||reviews.shop.svc.cluster.local"
	assert.Equal(t, cluster.Cluster_RANDOM, clusterOf(t, viewOf(t, cfg, nil), name).GetLbPolicy(), "a client in shop")
	web := map[string]any{"NAMESPACE": "web", "LABELS": map[string]any{"app": "web"}}
	assert.Equal(t, cluster.Cluster_RANDOM, clusterOf(t, viewOf(t, cfg, web), name).GetLbPolicy(), "a client in web")
	local := cfg + `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  trafficPolicy: {loadBalancer: {simple: LEAST_REQUEST}}
`
	assert.Equal(t, cluster.Cluster_LEAST_REQUEST, clusterOf(t, viewOf(t, local, web), name).GetLbPolicy(), "the service's namespace first")
}

// A port-level consistent hash applies to the routes of its own port only, and a port-level
// load balancer reaches a subset of the rule as well (the subset's own policy changing
// something else).
func TestPortLevelSettingsApplyToTheirPort(t *testing.T) {
	v := viewOf(t, reviewsSE+`---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    portLevelSettings:
    - {port: {number: 9090}, loadBalancer: {consistentHash: {httpHeaderName: x-other}}}
    - {port: {number: 9080}, loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
  subsets:
  - {name: v1, labels: {version: v1}, trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}}
`, nil)
	r := vhost(t, routeConfig(t, v, "9080"), "reviews.shop.svc.cluster.local:9080").GetRoutes()[0]
	require.Len(t, r.GetRoute().GetHashPolicy(), 1)
	assert.Equal(t, "x-user", r.GetRoute().GetHashPolicy()[0].GetHeader().GetHeaderName())
	subset := clusterOf(t, v, "outbound|9080|v1|reviews.shop.svc.cluster.local")
	assert.Equal(t, cluster.Cluster_RING_HASH, subset.GetLbPolicy(), "the port's hash, not the rule's round robin")
	assert.Equal(t, uint32(7), subset.GetCircuitBreakers().GetThresholds()[0].GetMaxConnections().GetValue())
}

// An endpoint's locality may name only a region (or a region and a zone).
func TestEndpointLocalityMayBeARegionOnly(t *testing.T) {
	v := viewOf(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: geo, namespace: shop}
spec:
  hosts: [geo.shop.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 80, name: http}]
  endpoints: [{address: 10.3.0.1, locality: eu}, {address: 10.3.0.2, locality: us/east}]
`, nil)
	rs := xds.Endpoints(v, []string{"outbound|80||geo.shop.svc.cluster.local"})
	require.Len(t, rs, 1)
	var got []string
	for _, le := range rs[0].Message.(*endpoint.ClusterLoadAssignment).GetEndpoints() {
		l := le.GetLocality()
		got = append(got, l.GetRegion()+"|"+l.GetZone()+"|"+l.GetSubZone())
	}
	assert.ElementsMatch(t, []string{"eu||", "us|east|"}, got)
}

// failoverPriority and failover together: the label priorities come first and the locality
// failover orders the endpoints within each of them (Istio's applyLocalityFailover keeps an
// assigned priority times 5 and adds the locality's 0 to 4), then the priorities are made
// consecutive.
func TestFailoverPriorityThenLocalityFailover(t *testing.T) {
	snap := snapshotOf(t, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http}]
  endpoints:
  - {address: 10.1.0.1, locality: us-east/zone1/a, labels: {topology.istio.io/network: n1}}
  - {address: 10.1.0.2, locality: us-east/zone1/a, labels: {topology.istio.io/network: n2}}
  - {address: 10.1.0.3, locality: eu-west/zone1, labels: {topology.istio.io/network: n1}}
  - {address: 10.1.0.4, locality: us-west/zone1, labels: {topology.istio.io/network: n1}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 3}
    loadBalancer:
      localityLbSetting:
        failoverPriority: [topology.istio.io/network]
        failover: [{from: us-east, to: eu-west}]
`)
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": "shop",
		"LABELS": map[string]any{"app": "client", "topology.istio.io/network": "n1"}})
	require.NoError(t, err)
	p, err := model.ParseNode(&core.Node{Id: "sidecar~10.2.0.1~client-1.shop~shop.svc.cluster.local", Metadata: md,
		Locality: &core.Locality{Region: "us-east", Zone: "zone1", SubZone: "a"}})
	require.NoError(t, err)
	rs := xds.Endpoints(xds.NewView(snap, p), []string{"outbound|9080||reviews.shop.svc.cluster.local"})
	require.Len(t, rs, 1)
	cla := rs[0].Message.(*endpoint.ClusterLoadAssignment)
	require.NoError(t, cla.ValidateAll())
	got := map[string]uint32{}
	for _, le := range cla.GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			got[lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()] = le.GetPriority()
		}
	}
	assert.Equal(t, map[string]uint32{
		"10.1.0.1": 0, // same network, same locality
		"10.1.0.3": 1, // same network, the failover region
		"10.1.0.4": 2, // same network, elsewhere
		"10.1.0.2": 3, // another network, however close
	}, got)
}
