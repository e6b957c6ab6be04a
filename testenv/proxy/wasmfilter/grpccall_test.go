package wasmfilter

import (
	"context"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http/httpguts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// healthService is a real gRPC server (the standard health service) on a loopback
// listener. Its interceptor echoes the x-echo metadata into a header and a trailer,
// records each call's deadline and, for calls with x-sleep, holds the call until the
// client goes away and reports how its context ended.
type healthService struct {
	addr string

	mu        sync.Mutex
	deadlines []time.Duration // time left at arrival; -1 without a deadline
	arrived   chan string     // the x-sleep value of each call that has it
	ended     chan sleepEnd   // how each x-sleep call's context ended
}

type sleepEnd struct {
	tag string
	err error
}

func startHealthService(t testing.TB) *healthService {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &healthService{addr: lis.Addr().String(), arrived: make(chan string, 4), ended: make(chan sleepEnd, 4)}
	srv := grpc.NewServer(grpc.UnaryInterceptor(hs.intercept))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return hs
}

func (hs *healthService) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	left := time.Duration(-1)
	if d, ok := ctx.Deadline(); ok {
		left = time.Until(d)
	}
	hs.mu.Lock()
	hs.deadlines = append(hs.deadlines, left)
	hs.mu.Unlock()
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-echo"); len(v) > 0 {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-echo", v[0]))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-echo-t", v[0]))
	}
	if tag := md.Get("x-sleep"); len(tag) > 0 {
		hs.arrived <- tag[0]
		<-ctx.Done()
		hs.ended <- sleepEnd{tag[0], ctx.Err()}
		return nil, ctx.Err()
	}
	return handler(ctx, req)
}

// staticCluster is a STATIC cluster with one endpoint, speaking HTTP/2 when h2.
func staticCluster(t testing.TB, name, addr string, h2 bool) *clusterv3.Cluster {
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	p, err := net.LookupPort("tcp", port)
	require.NoError(t, err)
	cl := &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout: durationpb.New(time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}}}}}}}}}}
	if h2 {
		opts, err := anypb.New(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})
		require.NoError(t, err)
		cl.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts}
	}
	require.NoError(t, cl.ValidateAll())
	return cl
}

// grpcProxy is meshproxy's Wasm manager with clusters "rls" (the health service over
// HTTP/2), "rls-h1" (the same over HTTP/1.1 only) and "down" (a closed port), and the
// sdkguest plugin calling "rls" with the given timeout.
func grpcProxy(t testing.TB, hs *healthService, timeoutMs string) (*Manager, *host.Plugin) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.DiscardHandler)
	store := stats.NewStore(nil, nil)
	clusters := upstream.NewManager(ctx, store, log)
	t.Cleanup(clusters.Close)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	downAddr := closed.Addr().String()
	require.NoError(t, closed.Close())
	for _, cl := range []*clusterv3.Cluster{staticCluster(t, "rls", hs.addr, true),
		staticCluster(t, "rls-h1", hs.addr, false), staticCluster(t, "down", downAddr, true)} {
		require.NoError(t, clusters.AddOrUpdate(cl, "v1", true))
	}
	m, err := New(ctx, Options{Store: store, Clusters: clusters, Log: log})
	require.NoError(t, err)
	art, err := wasmbuild.Build(ctx, "../../../filters/internal/sdkguest", wasmbuild.Options{})
	require.NoError(t, err)
	wasm, err := art.Bytes()
	require.NoError(t, err)
	mod, err := m.rt.Compile(ctx, wasm)
	require.NoError(t, err)
	cfg := `{"grpc": {"target": "rls", "grpcService": true, "authority": "rls.test",
		"service": "grpc.health.v1.Health", "method": "Check", "timeoutMs": ` + timeoutMs + `}}`
	p, err := m.rt.NewPlugin(ctx, mod, host.PluginConfig{Name: "sdk", Configuration: []byte(cfg),
		CallbackTimeout: time.Minute}, m.env)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return m, p
}

// grpcExchange runs one request with the grpc op through the plugin and returns the
// response headers the guest wrote once the call ended.
func grpcExchange(t testing.TB, p *host.Plugin, op string, extra ...[2]string) *host.Headers {
	t.Helper()
	ctx := context.Background()
	resumed := make(chan host.Signal, 4)
	s, err := p.NewHTTPStream(ctx, host.StreamOptions{OnSignal: func(sig host.Signal) { resumed <- sig }})
	require.NoError(t, err)
	defer s.Finish(ctx)
	h := host.NewHeaders(append([][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-op", op}}, extra...)...)
	if res := s.OnRequestHeaders(ctx, h, true); res.Action == host.Pause {
		select {
		case sig := <-resumed:
			require.Equal(t, host.SignalContinue, sig.Kind)
		case <-time.After(10 * time.Second):
			t.Fatal("the call never ended")
		}
	}
	resp := host.NewHeaders([2]string{":status", "200"})
	s.OnResponseHeaders(ctx, resp, true)
	return resp
}

func header(h *host.Headers, k string) string {
	v, _ := h.Get(k)
	return v
}

func healthRequest(t *testing.T, service string) string {
	b, err := proto.Marshal(&healthpb.HealthCheckRequest{Service: service})
	require.NoError(t, err)
	return string(b)
}

// proxy_grpc_call through meshproxy's cluster manager to a real gRPC server over HTTP/2:
// the answer with its metadata, an error status (a trailers-only answer), the timeout
// sent as grpc-timeout and enforced by the host (DEADLINE_EXCEEDED), and UNAVAILABLE for
// a closed port and for a cluster without HTTP/2.
func TestGRPCCallToARealServer(t *testing.T) {
	hs := startHealthService(t)
	_, p := grpcProxy(t, hs, "300")
	serving, err := proto.Marshal(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	require.NoError(t, err)

	h := grpcExchange(t, p, "grpc", [2]string{"x-grpc-md", "x-echo=hi"})
	// One callback, proxy_on_grpc_receive, with the message and both metadata maps.
	trace := header(h, "x-grpc-trace")
	imd, tmd, ok := strings.Cut(strings.TrimPrefix(trace, "msg(2:"+string(serving)+":0:0:"), "#")
	require.True(t, ok && strings.HasPrefix(trace, "msg(2:"+string(serving)+":0:0:"), trace)
	assert.Contains(t, imd, "content-type=application/grpc")
	assert.Contains(t, imd, "x-echo=hi")
	assert.Contains(t, tmd, "x-echo-t=hi")
	assert.Contains(t, tmd, "grpc-status=0")
	hs.mu.Lock()
	left := hs.deadlines[0]
	hs.mu.Unlock()
	assert.True(t, left > 0 && left <= 300*time.Millisecond, "grpc-timeout gave the server a deadline of %v", left)

	// An unknown service: NOT_FOUND with grpc-message, no message delivered.
	h = grpcExchange(t, p, "grpc", [2]string{"x-grpc-message", healthRequest(t, "nope")})
	assert.Equal(t, "close(5:5:unknown service:buf=1)", header(h, "x-grpc-trace"), "proxy_on_grpc_close alone")

	// The server holds the call: the host times it out after 300 ms, or the server's own
	// deadline (from grpc-timeout) answers DEADLINE_EXCEEDED first; the server's context
	// ends either way.
	start := time.Now()
	h = grpcExchange(t, p, "grpc", [2]string{"x-grpc-md", "x-sleep=1"})
	assert.True(t, strings.HasPrefix(header(h, "x-grpc-trace"), "close(4:4:"), header(h, "x-grpc-trace"))
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	select {
	case end := <-hs.ended:
		assert.Error(t, end.err)
	case <-time.After(5 * time.Second):
		t.Fatal("the server's call never ended")
	}

	for target, want := range map[string]string{
		"down":   "close(14:14:",
		"rls-h1": "close(14:14:cluster rls-h1 is not configured for HTTP/2",
	} {
		h = grpcExchange(t, p, "grpc", [2]string{"x-grpc-target", target})
		assert.True(t, strings.HasPrefix(header(h, "x-grpc-trace"), want), "%s: %s", target, header(h, "x-grpc-trace"))
	}
	h = grpcExchange(t, p, "grpc", [2]string{"x-grpc-target", "no-such-cluster"})
	assert.Equal(t, "2", header(h, "x-grpc-call"))
	assert.Empty(t, header(h, "x-grpc-trace"))
}

// A pending call is reset upstream when the guest's plugin closes; a call the guest
// cancels gets no callback.
func TestGRPCCallCancelResetsTheServerCall(t *testing.T) {
	hs := startHealthService(t)
	_, p := grpcProxy(t, hs, "0")
	h := grpcExchange(t, p, "grpc-cancel", [2]string{"x-grpc-md", "x-sleep=cancelled"})
	assert.Equal(t, "0,1,1", header(h, "x-grpc-cancel"))
	assert.Empty(t, header(h, "x-grpc-trace"))

	ctx := context.Background()
	s, err := p.NewHTTPStream(ctx, host.StreamOptions{})
	require.NoError(t, err)
	res := s.OnRequestHeaders(ctx, host.NewHeaders([2]string{":method", "GET"}, [2]string{":path", "/"},
		[2]string{":authority", "a"}, [2]string{"x-op", "grpc"}, [2]string{"x-grpc-md", "x-sleep=pending"}), true)
	require.Equal(t, host.Pause, res.Action)
	// The cancelled call above may or may not have reached the server first.
	deadline := time.After(5 * time.Second)
	for arrived := ""; arrived != "pending"; {
		select {
		case arrived = <-hs.arrived:
		case <-deadline:
			t.Fatal("the call never reached the server")
		}
	}
	require.NoError(t, p.Close(ctx))
	for {
		select {
		case end := <-hs.ended:
			if end.tag == "pending" {
				assert.ErrorIs(t, end.err, context.Canceled)
				return
			}
		case <-deadline:
			t.Fatal("closing the plugin did not reset the server's call")
		}
	}
}

// BenchmarkGRPCCall is one request whose filter makes a gRPC call through meshproxy's
// cluster to the real health service over HTTP/2 and resumes on the answer: the host,
// the HTTP/2 client and server and the guest together. p50 and p99 are per request.
func BenchmarkGRPCCall(b *testing.B) {
	hs := startHealthService(b)
	_, p := grpcProxy(b, hs, "1000")
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		h := grpcExchange(b, p, "grpc")
		lat = append(lat, time.Since(start))
		if !strings.HasPrefix(header(h, "x-grpc-trace"), "msg(") {
			b.Fatalf("call failed: %s", header(h, "x-grpc-trace"))
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
}

func TestGRPCTimeoutHeader(t *testing.T) {
	for d, want := range map[time.Duration]string{
		250 * time.Millisecond:            "250m",
		99999999 * time.Millisecond:       "99999999m",
		100000000 * time.Millisecond:      "100000S",
		math.MaxUint32 * time.Millisecond: "4294967S",
	} {
		assert.Equal(t, want, grpcTimeout(d), d.String())
	}
}

// Without an authority in its GrpcService, a call to an Istio cluster goes to the service's
// host and port: Envoy would send the cluster name, which Go's HTTP/2 client refuses.
func TestGRPCCallDefaultAuthority(t *testing.T) {
	for cluster, want := range map[string]string{
		"outbound|8081||ratelimit.default.svc.cluster.local": "ratelimit.default.svc.cluster.local:8081",
		"outbound|8081|v1|rls.example":                       "rls.example:8081",
		"rls":                                                "rls",
	} {
		hr, err := grpcHTTPRequest(context.Background(), &host.GRPCCallRequest{Cluster: cluster, Service: "s", Method: "m"})
		require.NoError(t, err)
		assert.Equal(t, want, hr.Host, cluster)
		assert.True(t, httpguts.ValidHostHeader(hr.Host), "a host Go's HTTP/2 client sends: %q", hr.Host)
	}
}
