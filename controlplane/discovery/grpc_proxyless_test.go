package discovery_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
)

// reviewsServer is a plain gRPC server whose health answer tells which version it is: v1
// answers SERVING, v2 NOT_SERVING.
func reviewsServer(t *testing.T, serving bool) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer()
	h := health.NewServer()
	st := healthpb.HealthCheckResponse_SERVING
	if !serving {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.SetServingStatus("", st)
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().(*net.TCPAddr).Port
}

func grpcConfig(v1, v2 int, http string) map[string]string {
	return map[string]string{
		"reviews.yaml": fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: grpc}]
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: v1}}
  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews.shop.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
`, v1, v2),
		"reviews-vs.yaml": `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http:
` + http,
	}
}

// A proxyless gRPC client (google.golang.org/grpc/xds, node metadata GENERATOR: grpc)
// resolves its target through discovery and balances by the VirtualService: the weight
// split, a header match, fault injection, and a change of routing all take effect without a
// proxy.
func TestProxylessGRPCFollowsVirtualService(t *testing.T) {
	v1, v2 := reviewsServer(t, true), reviewsServer(t, false)
	split := `  - match: [{headers: {x-user: {exact: jason}}}]
    fault: {abort: {grpcStatus: UNAVAILABLE, percentage: {value: 100}}}
    route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v1}}]
  - route:
    - {destination: {host: reviews.shop.svc.cluster.local, subset: v1}, weight: 80}
    - {destination: {host: reviews.shop.svc.cluster.local, subset: v2}, weight: 20}
`
	files := grpcConfig(v1, v2, split)
	e := start(t, files, nil)

	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": {"id": "sidecar~127.0.0.1~grpc-client.shop~shop.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "shop"}}
}`, e.d.GRPCAddr())
	rb, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	require.NoError(t, err)
	cc, err := grpc.NewClient("xds:///reviews.shop.svc.cluster.local:9080", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb))
	require.NoError(t, err)
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)

	// call returns "v1", "v2" or the gRPC code of a failed call.
	call := func(md ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if len(md) > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, md...)
		}
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return status.Code(err).String()
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return "v1"
		}
		return "v2"
	}
	count := func(n int, md ...string) map[string]int {
		out := map[string]int{}
		for i := 0; i < n; i++ {
			out[call(md...)]++
		}
		return out
	}

	require.Eventually(t, func() bool { return call() == "v1" }, 20*time.Second, 50*time.Millisecond, "the client never resolved through discovery")
	got := count(2000)
	t.Logf("80/20 split: %v", got)
	assert.InDelta(t, 0.8, float64(got["v1"])/2000, 0.05)
	assert.InDelta(t, 0.2, float64(got["v2"])/2000, 0.05)

	// The header match and its fault: every call from jason fails with UNAVAILABLE.
	assert.Equal(t, map[string]int{codes.Unavailable.String(): 50}, count(50, "x-user", "jason"))

	// A new VirtualService reaches the client: everything to v2.
	e.write("reviews-vs.yaml", grpcConfig(v1, v2, "  - route: [{destination: {host: reviews.shop.svc.cluster.local, subset: v2}}]\n")["reviews-vs.yaml"])
	require.Eventually(t, func() bool {
		got := count(20)
		return got["v2"] == 20
	}, 20*time.Second, 50*time.Millisecond, "the routing change never reached the client")
	assert.Equal(t, map[string]int{"v2": 200}, count(200, "x-user", "jason"))
	// gRPC accepted everything it was sent.
	for _, c := range e.d.Server.Connections() {
		for _, st := range c.SyncStatus() {
			assert.Zero(t, st.Nacks, "%s %s: %s", c.ID, st.Type, st.NackError)
		}
	}
}

// A proxyless gRPC server (xds.NewGRPCServer) gets its inbound listener from discovery, and
// its own xDS connection registers it as the endpoint a proxyless client then reaches.
func TestProxylessGRPCServerRegistersAndServes(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := lis.Addr().(*net.TCPAddr).Port
	e := start(t, map[string]string{"ratings.yaml": fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ratings, namespace: shop}
spec:
  hosts: [ratings.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9090, name: grpc, targetPort: %d}]
  workloadSelector: {labels: {app: ratings}}
`, port)}, nil)
	bootstrap := func(node string) []byte {
		return []byte(fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%%s",
  "node": %s
}`, e.d.GRPCAddr(), node))
	}

	serving := make(chan struct{})
	srv, err := xds.NewGRPCServer(xds.BootstrapContentsForTesting(bootstrap(`{"id": "sidecar~127.0.0.1~ratings-1.shop~shop.svc.cluster.local",
    "metadata": {"GENERATOR": "grpc", "NAME": "ratings-1", "NAMESPACE": "shop", "LABELS": {"app": "ratings"}, "INSTANCE_IPS": "127.0.0.1"}}`)),
		xds.ServingModeCallback(func(_ net.Addr, args xds.ServingModeChangeArgs) {
			if args.Mode == connectivity.ServingModeServing {
				select {
				case <-serving:
				default:
					close(serving)
				}
			}
		}))
	require.NoError(t, err)
	h := health.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	select {
	case <-serving:
	case <-time.After(20 * time.Second):
		t.Fatal("the xDS server never got its inbound listener")
	}

	rb, err := xds.NewXDSResolverWithConfigForTesting(bootstrap(`{"id": "sidecar~127.0.0.2~client-1.shop~shop.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "shop"}}`))
	require.NoError(t, err)
	cc, err := grpc.NewClient("xds:///ratings.shop.svc.cluster.local:9090", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb))
	require.NoError(t, err)
	defer cc.Close()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}, 20*time.Second, 50*time.Millisecond, "the client never reached the xDS server through discovery")
}
