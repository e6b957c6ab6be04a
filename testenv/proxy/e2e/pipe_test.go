package e2e

import (
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// unixUpstream is an upstream (HTTP/1.1 and h2c) listening on a Unix socket at path.
func unixUpstream(t *testing.T, name, path string) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-upstream", name)
		w.Header().Set("x-seen-proto", r.Proto)
	}))
	_ = srv.Listener.Close()
	srv.Listener = lis
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = p
	srv.Start()
	t.Cleanup(srv.Close)
}

func pipeEndpoints(name string, paths ...string) *endpointv3.ClusterLoadAssignment {
	var lbs []*endpointv3.LbEndpoint
	for _, p := range paths {
		lbs = append(lbs, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: p}}}}}})
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}}
}

// TestPipeAddresses: ADS over the bootstrap's xds-grpc cluster whose endpoint is a pipe
// (as the agent's bootstrap, the XDS proxy on a Unix socket), and EDS endpoints that are
// pipes reached over HTTP/1.1 and HTTP/2.
func TestPipeAddresses(t *testing.T) {
	dir := t.TempDir()
	xds := filepath.Join(dir, "XDS")
	cp := newControlPlane(t, xds)
	unixUpstream(t, "pipe-svc", filepath.Join(dir, "svc.sock"))
	boot := strings.Replace(adsBootstrap("127.0.0.1:1", false),
		"{socket_address: {address: 127.0.0.1, port_value: 1}}", "{pipe: {path: "+xds+"}}", 1)
	require.Contains(t, boot, "pipe: {path: ")

	h1 := edsCluster("svc")
	h2 := edsCluster("svc2")
	opts, err := anypb.New(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})
	require.NoError(t, err)
	h2.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts}
	cp.set("v1", map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {h1, h2},
		resourcev3.EndpointType: {pipeEndpoints("svc", filepath.Join(dir, "svc.sock")), pipeEndpoints("svc2", filepath.Join(dir, "svc.sock"))},
		resourcev3.ListenerType: {httpListener(t, "in", "r1", corev3.TrafficDirection_INBOUND), httpListener(t, "in2", "r2", corev3.TrafficDirection_INBOUND)},
		resourcev3.RouteType:    {routeTo("r1", "svc"), routeTo("r2", "svc2")},
	})
	p := proxytest.Start(t, proxytest.Options{Bootstrap: boot, NoWait: true})
	p.WaitReady(15 * time.Second)
	c := client(t)
	r := do(t, c, "GET", "http://"+p.ListenerAddr("in")+"/", "", nil)
	assert.Equal(t, 200, r.code)
	assert.Equal(t, "pipe-svc", r.header.Get("x-upstream"))
	assert.Equal(t, "HTTP/1.1", r.header.Get("x-seen-proto"))
	r = do(t, c, "GET", "http://"+p.ListenerAddr("in2")+"/", "", nil)
	assert.Equal(t, 200, r.code)
	assert.Equal(t, "HTTP/2.0", r.header.Get("x-seen-proto"))
	assert.Equal(t, int64(1), p.Stat("cluster.svc2.upstream_cx_http2_total"))
	assert.Equal(t, int64(1), p.Stat("control_plane.connected_state"))
}

// TestPipeInDNSClusterRefused: a pipe cannot be resolved; a DNS cluster naming one is
// refused with the address in the error.
func TestPipeInDNSClusterRefused(t *testing.T) {
	cl := &clusterv3.Cluster{Name: "dns", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		LoadAssignment: pipeEndpoints("dns", "/tmp/x.sock")}
	require.NoError(t, cl.ValidateAll())
	cp := newControlPlane(t, "")
	cp.set("v1", map[resourcev3.Type][]types.Resource{resourcev3.ClusterType: {cl}})
	p := proxytest.Start(t, proxytest.Options{Bootstrap: adsBootstrap(cp.addr, false), NoWait: true})
	p.Eventually(10*time.Second, "a NACK naming the pipe", func() bool {
		for _, m := range cp.nackMessages() {
			if strings.Contains(m, "pipe address /tmp/x.sock in a STRICT_DNS cluster") {
				return true
			}
		}
		return false
	})
}
