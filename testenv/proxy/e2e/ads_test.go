package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

const testNode = "sidecar~127.0.0.1~ads.default~default.svc.cluster.local"

// controlPlane is a go-control-plane ADS server in the test process.
type controlPlane struct {
	t     testing.TB
	cache cachev3.SnapshotCache
	addr  string
	grpc  *grpc.Server
	srv   serverv3.Server

	mu       sync.Mutex
	nacks    []string // error_detail messages received
	acks     map[string]string
	requests map[string]int // requests received, by type URL
}

func newControlPlane(t testing.TB, addr string) *controlPlane {
	t.Helper()
	cp := &controlPlane{t: t, cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), acks: map[string]string{},
		requests: map[string]int{}}
	cp.start(addr)
	return cp
}

func (cp *controlPlane) record(typeURL, version string, detail string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.requests[typeURL]++
	if detail != "" {
		cp.nacks = append(cp.nacks, typeURL+": "+detail)
	} else if version != "" {
		cp.acks[typeURL] = version
	}
}

func (cp *controlPlane) start(addr string) {
	cb := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			cp.record(r.GetTypeUrl(), r.GetVersionInfo(), r.GetErrorDetail().GetMessage())
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			v := ""
			if r.GetResponseNonce() != "" {
				v = "acked"
			}
			cp.record(r.GetTypeUrl(), v, r.GetErrorDetail().GetMessage())
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp.srv = serverv3.NewServer(ctx, cp.cache, cb)
	cp.grpc = grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(cp.grpc, cp.srv)
	var lis net.Listener
	var err error
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	// The old socket of a restarted control plane may linger.
	network := "tcp"
	if strings.HasPrefix(addr, "/") {
		network = "unix" // a pipe address (tests of the xds-grpc pipe cluster)
	}
	require.Eventually(cp.t, func() bool {
		lis, err = net.Listen(network, addr)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "listen on %s", addr)
	cp.addr = lis.Addr().String()
	go func() { _ = cp.grpc.Serve(lis) }()
	cp.t.Cleanup(func() { cp.grpc.Stop(); cancel() })
}

func (cp *controlPlane) stop() { cp.grpc.Stop() }

func (cp *controlPlane) set(version string, res map[resourcev3.Type][]types.Resource) {
	cp.t.Helper()
	snap, err := cachev3.NewSnapshot(version, res)
	require.NoError(cp.t, err)
	require.NoError(cp.t, cp.cache.SetSnapshot(context.Background(), testNode, snap))
}

// requested is how many requests of a type the control plane received.
func (cp *controlPlane) requested(typeURL string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.requests[typeURL]
}

func (cp *controlPlane) nackMessages() []string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]string(nil), cp.nacks...)
}

func adsBootstrap(cpAddr string, delta bool) string {
	api := "GRPC"
	if delta {
		api = "DELTA_GRPC"
	}
	return `
node: {id: "` + testNode + `", cluster: ads.default}
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
dynamic_resources:
  ads_config:
    api_type: ` + api + `
    transport_api_version: V3
    grpc_services: [{envoy_grpc: {cluster_name: xds-grpc}}]
  cds_config: {ads: {}, resource_api_version: V3}
  lds_config: {ads: {}, resource_api_version: V3}
static_resources:
  clusters:` + staticCluster("xds-grpc", h2ProtocolOptions, cpAddr) + "\n"
}

// h2ProtocolOptions makes a static cluster speak HTTP/2 (the xDS cluster).
const h2ProtocolOptions = `
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}`

func edsCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		ConnectTimeout:       durationpb.New(time.Second),
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig: &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}},
		},
	}
}

func endpoints(name string, addrs ...string) *endpointv3.ClusterLoadAssignment {
	var lbs []*endpointv3.LbEndpoint
	for _, a := range addrs {
		h, p, _ := net.SplitHostPort(a)
		var port uint32
		_, _ = fmt.Sscanf(p, "%d", &port)
		lbs = append(lbs, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: h, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}}}})
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}}
}

// httpListener is a listener on 127.0.0.1:0 with RDS routes and the given extra filters
// before the router.
func httpListener(t testing.TB, name, routeName string, direction corev3.TrafficDirection, filters ...*hcmv3.HttpFilter) *listenerv3.Listener {
	t.Helper()
	router, err := anypb.New(&routerv3.Router{})
	require.NoError(t, err)
	m := &hcmv3.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: routeName,
			ConfigSource: &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}}},
		HttpFilters: append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}),
	}
	ma, err := anypb.New(m)
	require.NoError(t, err)
	return &listenerv3.Listener{
		Name:             name,
		TrafficDirection: direction,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: ma}}}}},
	}
}

func routeTo(name, cluster string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{
		Name: "all", Domains: []string{"*"},
		Routes: []*routev3.Route{{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}}}},
	}}}
}

func directRoute(name, body string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{
		Name: "all", Domains: []string{"*"},
		Routes: []*routev3.Route{{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 200,
				Body: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body}}}}}},
	}}}
}

func TestADS(t *testing.T) {
	for _, delta := range []bool{false, true} {
		name := "sotw"
		if delta {
			name = "delta"
		}
		t.Run(name, func(t *testing.T) { testADS(t, delta) })
	}
}

func testADS(t *testing.T, delta bool) {
	up := newUpstream(t, "svc", false, nil)
	cp := newControlPlane(t, "")
	// v1: the cluster has no endpoints and the listener no routes yet: both warm.
	cp.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("svc")},
		resourcev3.ListenerType: {httpListener(t, "in", "r1", corev3.TrafficDirection_INBOUND)},
	})
	p := proxytest.Start(t, proxytest.Options{Bootstrap: adsBootstrap(cp.addr, delta), NoWait: true})
	p.Eventually(10*time.Second, "the EDS cluster warming", func() bool {
		_, dump := p.Get("/config_dump")
		return strings.Contains(dump, "dynamicWarmingClusters") || strings.Contains(dump, "dynamic_warming_clusters")
	})
	code, body := p.Get("/ready")
	assert.Equal(t, 503, code)
	assert.Equal(t, "INITIALIZING", strings.TrimSpace(body))

	// v2: endpoints and routes arrive: the cluster and then the listener become active.
	cp.set("v2", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("svc")},
		resourcev3.EndpointType: {endpoints("svc", addr(up))},
		resourcev3.ListenerType: {httpListener(t, "in", "r1", corev3.TrafficDirection_INBOUND)},
		resourcev3.RouteType:    {routeTo("r1", "svc")},
	})
	p.WaitReady(15 * time.Second)
	base := "http://" + p.ListenerAddr("in")
	c := client(t)
	assert.Equal(t, "svc", do(t, c, "GET", base+"/", "", nil).header.Get("x-upstream"))
	assert.Equal(t, int64(1), p.Stat("cluster.svc.membership_total"))

	// v3: a listener with an unknown HTTP filter and a cluster with an unsupported LB policy
	// are NACKed, naming the resources; the last accepted config keeps serving.
	bad := httpListener(t, "in", "r1", corev3.TrafficDirection_INBOUND, &hcmv3.HttpFilter{Name: "bogus.filter",
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustStruct(t)}})
	badCluster := edsCluster("svc")
	badCluster.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	cp.set("v3", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {badCluster},
		resourcev3.EndpointType: {endpoints("svc", addr(up))},
		resourcev3.ListenerType: {bad},
		resourcev3.RouteType:    {routeTo("r1", "svc")},
	})
	p.Eventually(10*time.Second, "NACKs for the bad listener and cluster", func() bool {
		var l, cl bool
		for _, m := range cp.nackMessages() {
			if strings.Contains(m, resourcev3.ListenerType) && strings.Contains(m, "in:") && strings.Contains(m, "bogus.filter") {
				l = true
			}
			if strings.Contains(m, resourcev3.ClusterType) && strings.Contains(m, "svc:") && strings.Contains(m, "lb_policy") {
				cl = true
			}
		}
		return l && cl
	})
	assert.Equal(t, "svc", do(t, c, "GET", base+"/", "", nil).header.Get("x-upstream"), "last good config serves")
	assert.GreaterOrEqual(t, p.Stat("listener_manager.lds.update_rejected"), int64(1))

	// The control plane goes away: the proxy keeps serving, reconnects when it is back and
	// takes the new config.
	cp.stop()
	assert.Equal(t, "svc", do(t, c, "GET", base+"/", "", nil).header.Get("x-upstream"))
	cp2 := newControlPlane(t, cp.addr)
	cp2.set("v4", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {edsCluster("svc")},
		resourcev3.EndpointType: {endpoints("svc", addr(up))},
		resourcev3.ListenerType: {httpListener(t, "in", "r1", corev3.TrafficDirection_INBOUND)},
		resourcev3.RouteType:    {directRoute("r1", "from v4")},
	})
	p.Eventually(20*time.Second, "the route of the reconnected control plane", func() bool {
		req := do(t, c, "GET", base+"/", "", nil)
		return req.body == "from v4"
	})
}

// mustStruct is an Any of a registered type that no HTTP filter implements.
func mustStruct(t *testing.T) *anypb.Any {
	a, err := anypb.New(&structpb.Struct{})
	require.NoError(t, err)
	return a
}

// withBackoff sets the ADS stream's reconnect back-off in an adsBootstrap.
func withBackoff(bootstrap, backoff string) string {
	return strings.Replace(bootstrap, "{envoy_grpc: {cluster_name: xds-grpc}}",
		"{envoy_grpc: {cluster_name: xds-grpc, retry_policy: {retry_back_off: "+backoff+"}}}", 1)
}

// The bootstrap's envoy_grpc.retry_policy.retry_back_off bounds how long the proxy waits
// between reconnection attempts, so it is back soon after its control plane returns
// (with Envoy's default the wait grows to 30 s).
func TestADSReconnectBackoffFromBootstrap(t *testing.T) {
	cp := newControlPlane(t, "")
	res := map[resourcev3.Type][]types.Resource{
		resourcev3.ListenerType: {httpListener(t, "in", "r1", corev3.TrafficDirection_INBOUND)},
		resourcev3.RouteType:    {directRoute("r1", "hello")},
	}
	cp.set("v1", res)
	p := proxytest.Start(t, proxytest.Options{
		Bootstrap: withBackoff(adsBootstrap(cp.addr, false), "{base_interval: 0.05s, max_interval: 0.2s}"), NoWait: true})
	connected := func() bool { return p.Stat("control_plane.connected_state") == 1 }
	require.Eventually(t, connected, 10*time.Second, 10*time.Millisecond)

	cp.stop()
	require.Eventually(t, func() bool { return !connected() }, 5*time.Second, 10*time.Millisecond)
	// Attempts fail meanwhile (each one counts a destroyed connection of the xds-grpc
	// cluster): ten of them, which the back-off doubling from 50 ms unbounded would spread
	// over some 25 s; capped at 200 ms they keep coming.
	failed := p.Stat("cluster.xds-grpc.upstream_cx_destroy")
	p.Eventually(10*time.Second, "ten failed reconnection attempts", func() bool {
		return p.Stat("cluster.xds-grpc.upstream_cx_destroy") >= failed+10
	})
	cp2 := newControlPlane(t, cp.addr)
	cp2.set("v1", res)
	require.Eventually(t, connected, 1500*time.Millisecond, 10*time.Millisecond,
		"reconnected within a few 200 ms back-offs of the control plane's return\n%s", p.Stderr())

	// A back-off whose base exceeds its max is refused at start, naming the field.
	cfg := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(withBackoff(adsBootstrap(cp.addr, false),
		"{base_interval: 2s, max_interval: 1s}")), 0o644))
	out, err := exec.Command(proxytest.Binary(t), "-c", cfg).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "retry_back_off")
}
