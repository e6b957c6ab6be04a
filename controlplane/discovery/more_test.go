package discovery_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
)

func TestMeshConfigChangeIsAFullPush(t *testing.T) {
	meshFile := filepath.Join(t.TempDir(), "mesh.yaml")
	require.NoError(t, os.WriteFile(meshFile, []byte("connectTimeout: 1s\n"), 0o644))
	e := start(t, map[string]string{"services.yaml": services}, func(o *discovery.Options) { o.MeshConfigFile = meshFile })
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	lastVHost := func(c *adsc.Client) string {
		var rc route.RouteConfiguration
		if !c.Resource(adsc.RouteType, "9081", &rc) || len(rc.GetVirtualHosts()) == 0 {
			return ""
		}
		return rc.GetVirtualHosts()[len(rc.GetVirtualHosts())-1].GetName()
	}
	wait(t, fe, func(c *adsc.Client) bool { return lastVHost(c) == "allow_any" })
	require.NoError(t, os.WriteFile(meshFile, []byte("connectTimeout: 1s\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\n"), 0o644))
	e.d.Mesh.Reload() // what the watcher does on the write
	wait(t, fe, func(c *adsc.Client) bool { return lastVHost(c) == "block_all" })
}

func TestDeltaReconnectSkipsResourcesTheProxyHas(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, func(o *discovery.Options) { o.Server.ReconnectWindow = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(e.cc)
	n := node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")

	first, err := ads.DeltaAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, first.Send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: adsc.ClusterType}))
	resp, err := first.Recv()
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetResources())
	versions := map[string]string{}
	for _, r := range resp.GetResources() {
		versions[r.GetName()] = r.GetVersion()
	}
	require.NoError(t, first.CloseSend())

	// A reconnect that reports every cluster at its version gets none of them again, but still
	// an answer (Envoy waits for it to finish initialising).
	second, err := ads.DeltaAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, second.Send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: adsc.ClusterType, InitialResourceVersions: versions}))
	resp, err = second.Recv()
	require.NoError(t, err)
	assert.Empty(t, resp.GetResources())
	assert.Empty(t, resp.GetRemovedResources())

	// One that reports a stale version gets that cluster.
	versions[frontendCluster] = "stale"
	third, err := ads.DeltaAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, third.Send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: adsc.ClusterType, InitialResourceVersions: versions}))
	resp, err = third.Recv()
	require.NoError(t, err)
	require.Len(t, resp.GetResources(), 1)
	assert.Equal(t, frontendCluster, resp.GetResources()[0].GetName())
}

func TestDisconnectedProxyLeavesAfterGracePeriod(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, func(o *discovery.Options) { o.WorkloadGracePeriod = 100 * time.Millisecond })
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	ctx, cancel := context.WithCancel(context.Background())
	be, err := adsc.Dial(ctx, e.cc, adsc.Config{Node: node(t, "backend-1", "backend", "127.10.0.2", "127.20.0.2")})
	require.NoError(t, err)
	wait(t, fe, func(c *adsc.Client) bool { return len(endpointsOf(c, backendCluster)) == 1 })
	wait(t, be, has(adsc.ClusterType, backendCluster))

	cancel() // the backend proxy goes away
	<-be.Done()
	wait(t, fe, func(c *adsc.Client) bool {
		return c.Has(adsc.EndpointType, backendCluster) && len(endpointsOf(c, backendCluster)) == 0
	})
	for _, r := range fe.Responses()[len(fe.Responses())-1:] {
		assert.Equal(t, adsc.EndpointType, r.TypeURL, "removal is an endpoints-only push")
	}
}

func TestAgentHealthReportsGateEndpoints(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, nil)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	beNode := node(t, "backend-1", "backend", "127.10.0.2", "127.20.0.2")
	beNode.Metadata.Fields["WASMESH_HEALTH_CHECKED"] = structpb.NewStringValue("true")
	e.connect(adsc.Config{Node: beNode})

	// The backend's endpoint: "" while it is left out of EDS (unhealthy), else its health.
	healthOf := func(c *adsc.Client) string {
		var cla endpoint.ClusterLoadAssignment
		if !c.Resource(adsc.EndpointType, backendCluster, &cla) || len(cla.GetEndpoints()) == 0 || len(cla.GetEndpoints()[0].GetLbEndpoints()) == 0 {
			return ""
		}
		return cla.GetEndpoints()[0].GetLbEndpoints()[0].GetHealthStatus().String()
	}
	hasCLA := func(c *adsc.Client) bool {
		var cla endpoint.ClusterLoadAssignment
		return c.Resource(adsc.EndpointType, backendCluster, &cla)
	}
	// Registered, but out of EDS until the agent reports healthy (Istio leaves unhealthy
	// endpoints out by default).
	wait(t, fe, func(c *adsc.Client) bool { return hasCLA(c) && healthOf(c) == "" })

	// The agent's own stream: health requests, never an answer, never a proxy connection.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hs, err := discoverypb.NewAggregatedDiscoveryServiceClient(e.cc).StreamAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, hs.Send(&discoverypb.DiscoveryRequest{Node: beNode, TypeUrl: "istio.io/health"}))
	wait(t, fe, func(c *adsc.Client) bool { return healthOf(c) == "HEALTHY" })
	require.NoError(t, hs.Send(&discoverypb.DiscoveryRequest{TypeUrl: "istio.io/health", ErrorDetail: &statuspb.Status{Code: 14, Message: "draining"}}))
	wait(t, fe, func(c *adsc.Client) bool { return healthOf(c) == "" })
	assert.Len(t, e.d.Server.Connections(), 2, "the health stream is not a proxy")

	// Nothing was sent on the health stream: closing it ends it cleanly without a response.
	require.NoError(t, hs.CloseSend())
	_, err = hs.Recv()
	assert.ErrorIs(t, err, io.EOF)
}

// A health-checked proxy that resumes with config it had (discovery restarted under it) is
// not taken out of load balancing while its agent's health stream reconnects.
func TestResumingProxyStaysHealthyUntilItsAgentReports(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, nil)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	beNode := node(t, "backend-1", "backend", "127.10.0.2", "127.20.0.2")
	beNode.Metadata.Fields["WASMESH_HEALTH_CHECKED"] = structpb.NewStringValue("true")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(e.cc).StreamAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&discoverypb.DiscoveryRequest{Node: beNode, TypeUrl: adsc.ClusterType, VersionInfo: "from-the-previous-discovery"}))
	wait(t, fe, func(c *adsc.Client) bool {
		var cla endpoint.ClusterLoadAssignment
		return c.Resource(adsc.EndpointType, backendCluster, &cla) && len(cla.GetEndpoints()) == 1 &&
			cla.GetEndpoints()[0].GetLbEndpoints()[0].GetHealthStatus().String() == "HEALTHY"
	})
}

// After a restart, a proxy that resumes with its config gets no update until the reconnect
// window ends (the registry is still filling up), then everything; a fresh proxy is served
// at once.
func TestResumingProxyIsHeldForTheReconnectWindow(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, func(o *discovery.Options) { o.Server.ReconnectWindow = 500 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(e.cc)
	resumed, err := ads.StreamAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, resumed.Send(&discoverypb.DiscoveryRequest{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1"),
		TypeUrl: adsc.ClusterType, VersionInfo: "from-the-previous-discovery"}))
	got := make(chan time.Time, 1)
	go func() {
		if _, err := resumed.Recv(); err == nil {
			got <- time.Now()
		}
	}()
	fresh := e.connect(adsc.Config{Node: node(t, "backend-1", "backend", "127.10.0.2", "127.20.0.2")})
	wait(t, fresh, has(adsc.ClusterType, frontendCluster, backendCluster))
	select {
	case <-got:
		t.Fatal("the resumed proxy got an update inside the reconnect window")
	default:
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the resumed proxy got nothing after the reconnect window")
	}
}
