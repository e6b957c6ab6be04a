package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// fakeGenerator stands in for the pusher: it serves fixed clusters, records what each
// proxy watches, and pushes when the test says so. The server is judged alone, by what it
// sends for what the generator gives.
type fakeGenerator struct {
	mu       sync.Mutex
	snap     *xds.Snapshot
	clusters *xds.Resources
	proxies  []*fakeProxy

	// gate, when set, holds every push (a Resources call for a snapshot) until it is closed;
	// inFlight and most count the pushes held at once.
	gate           chan struct{}
	inFlight, most int
}

// hold makes pushes wait at the gate until release is called (at the latest when the test
// ends, so that a failed test does not leave the server's workers waiting).
func (g *fakeGenerator) hold(t *testing.T) (release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gate := make(chan struct{})
	g.gate = gate
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return release
}

// held is the number of pushes waiting at the gate now, and the most there were at once.
func (g *fakeGenerator) held() (now, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight, g.most
}

// pass is a push going through the gate.
func (g *fakeGenerator) pass() {
	g.mu.Lock()
	gate := g.gate
	if gate != nil {
		g.inFlight++
		g.most = max(g.most, g.inFlight)
	}
	g.mu.Unlock()
	if gate == nil {
		return
	}
	<-gate
	g.mu.Lock()
	g.inFlight--
	g.mu.Unlock()
}

func newFakeGenerator(version string, clusters ...string) *fakeGenerator {
	g := &fakeGenerator{}
	g.set(version, clusters...)
	return g
}

// set makes the generator serve clusters in a snapshot of version.
func (g *fakeGenerator) set(version string, clusters ...string) {
	var items []*xds.Resource
	for _, c := range clusters {
		items = append(items, xds.NewResource(c, &clusterv3.Cluster{Name: c}))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.snap = xds.NewSnapshot(push.Build(version, mesh.Default(), config.NewIndex(nil), registry.NewAggregate()))
	g.clusters = xds.NewResources(items)
}

// push hands every proxy a full push of the snapshot in force.
func (g *fakeGenerator) push() {
	g.mu.Lock()
	ev := pusher.NewEvent(g.snap, push.NewFull(push.ReasonConfig))
	proxies := slices.Clone(g.proxies)
	g.mu.Unlock()
	for _, p := range proxies {
		p.target.Push(ev)
	}
}

func (g *fakeGenerator) Ready() bool { return true }

func (g *fakeGenerator) Watch(p *model.Proxy, target pusher.Watcher) server.ProxyWatch {
	g.mu.Lock()
	defer g.mu.Unlock()
	fp := &fakeProxy{g: g, target: target, names: map[string][]string{}, wild: map[string]bool{}}
	g.proxies = append(g.proxies, fp)
	return fp
}

func (g *fakeGenerator) Current(reason string) *pusher.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	return pusher.NewEvent(g.snap, push.NewFull(reason))
}

type fakeProxy struct {
	g      *fakeGenerator
	target pusher.Watcher
	mu     sync.Mutex
	names  map[string][]string
	wild   map[string]bool
	closed bool
}

func (p *fakeProxy) Subscribe(typ string, wildcard bool, names []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wild[typ] = wildcard
	p.names[typ] = slices.Sorted(slices.Values(names))
}

func (p *fakeProxy) Change(typ string, add, remove []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := slices.DeleteFunc(slices.Clone(p.names[typ]), func(s string) bool { return slices.Contains(remove, s) })
	p.names[typ] = slices.Sorted(slices.Values(append(n, add...)))
}

func (p *fakeProxy) Watches(typ, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wild[typ] || slices.Contains(p.names[typ], name)
}

func (p *fakeProxy) Names(typ string) map[string]struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := map[string]struct{}{}
	for _, n := range p.names[typ] {
		set[n] = struct{}{}
	}
	return set
}

func (p *fakeProxy) Subscribed(typ string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.names[typ])
}

func (p *fakeProxy) SameNames(typ string, names []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Equal(p.names[typ], slices.Sorted(slices.Values(names)))
}

// Resources serves the generator's clusters (CDS only), all or those named.
func (p *fakeProxy) Resources(typ string, snap *xds.Snapshot) (*xds.Resources, string) {
	p.g.mu.Lock()
	set, cur := p.g.clusters, p.g.snap
	p.g.mu.Unlock()
	if snap == nil {
		snap = cur
	} else {
		p.g.pass()
	}
	if typ != xds.ClusterType {
		return xds.NewResources(nil), snap.Version
	}
	if p.Watches(typ, "*") {
		return set, snap.Version
	}
	return xds.Select(set, p.Names(typ)), snap.Version
}

func (p *fakeProxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
}

// serveFake runs a server over the fake generator and returns an ADS client.
func serveFake(t *testing.T, g *fakeGenerator) discoverygrpc.AggregatedDiscoveryServiceClient {
	t.Helper()
	_, ads := serveWith(t, server.Defaults(), server.Deps{Generator: g})
	return ads
}

// serveWith runs a server with opts and deps until the test ends, and returns it with an
// ADS client (dialled with dial's options too).
func serveWith(t *testing.T, opts server.Options, deps server.Deps, dial ...grpc.DialOption) (*server.Server, discoverygrpc.AggregatedDiscoveryServiceClient) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := server.New(log, metrics.New(prometheus.NewRegistry()), opts, deps)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran, served := make(chan struct{}), make(chan error, 1)
	go func() { srv.Run(ctx); close(ran) }()
	go func() { served <- server.Serve(ctx, srv.GRPCServer(), lis, time.Second) }()
	cc, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		cc.Close()
		cancel()
		<-ran
		require.NoError(t, <-served)
	})
	return srv, discoverygrpc.NewAggregatedDiscoveryServiceClient(cc)
}

// deltaCDS opens a delta stream naming the clusters names and returns it with its first
// response, which it ACKs.
func deltaCDS(t *testing.T, ctx context.Context, ads discoverygrpc.AggregatedDiscoveryServiceClient, names ...string) (
	discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, *discoverygrpc.DeltaDiscoveryResponse) {
	t.Helper()
	st, err := ads.DeltaAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: fakeNode(), TypeUrl: xds.ClusterType, ResourceNamesSubscribe: names}))
	resp, err := st.Recv()
	require.NoError(t, err)
	require.NoError(t, st.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: xds.ClusterType, ResponseNonce: resp.GetNonce()}))
	return st, resp
}

func fakeNode() *core.Node {
	meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo"})
	return &core.Node{Id: "sidecar~10.9.0.1~web-1.demo~demo.svc.cluster.local", Metadata: meta}
}

// The server sends what its generator gives, answers a push with what changed, tells the
// generator what each proxy watches, and lets go of the proxy when its stream ends; no
// snapshot is built and no config read.
func TestServerSendsWhatItsGeneratorGives(t *testing.T) {
	g := newFakeGenerator("v1", "a", "b")
	ads := serveFake(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("sotw", func(t *testing.T) {
		st, err := ads.StreamAggregatedResources(ctx)
		require.NoError(t, err)
		require.NoError(t, st.Send(&discoverygrpc.DiscoveryRequest{Node: fakeNode(), TypeUrl: xds.ClusterType}))
		resp, err := st.Recv()
		require.NoError(t, err)
		assert.Equal(t, "v1", resp.GetVersionInfo())
		assert.Equal(t, []string{"a", "b"}, names(t, resp.GetResources()))
		require.NoError(t, st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: xds.ClusterType, VersionInfo: "v1", ResponseNonce: resp.GetNonce()}))

		g.set("v2", "a", "c")
		g.push()
		resp, err = st.Recv()
		require.NoError(t, err)
		assert.Equal(t, "v2", resp.GetVersionInfo())
		assert.Equal(t, []string{"a", "c"}, names(t, resp.GetResources()), "a whole CDS: b is gone")
		require.NoError(t, st.CloseSend())
	})

	t.Run("delta", func(t *testing.T) {
		g.set("v3", "a", "b")
		st, resp := deltaCDS(t, ctx, ads, "a", "b")
		assert.Equal(t, []string{"a", "b"}, deltaNames(t, resp.GetResources()))
		g.mu.Lock()
		p := g.proxies[len(g.proxies)-1]
		g.mu.Unlock()
		assert.Equal(t, 2, p.Subscribed(xds.ClusterType), "the generator knows what the proxy watches")
		assert.True(t, p.Watches(xds.ClusterType, "a") && p.Watches(xds.ClusterType, "b"))

		// Unsubscribing b is the generator's to know; a push then sends only what changed
		// among the names still watched.
		require.NoError(t, st.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: xds.ClusterType, ResourceNamesUnsubscribe: []string{"b"}}))
		require.Eventually(t, func() bool { return !p.Watches(xds.ClusterType, "b") }, 5*time.Second, time.Millisecond)
		g.set("v4", "a", "b", "c")
		g.push()
		// a is unchanged and b, c are not watched: nothing to send; a later change of a is.
		g.mu.Lock()
		g.clusters = xds.NewResources([]*xds.Resource{xds.NewResource("a", &clusterv3.Cluster{Name: "a", AltStatName: "changed"})})
		g.mu.Unlock()
		g.push()
		resp, err := st.Recv()
		require.NoError(t, err)
		assert.Equal(t, []string{"a"}, deltaNames(t, resp.GetResources()))
		assert.Empty(t, resp.GetRemovedResources(), "b was unsubscribed, not removed")
		assert.Equal(t, "v4", resp.GetSystemVersionInfo())
		require.NoError(t, st.CloseSend())
		require.Eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.closed }, 5*time.Second, time.Millisecond,
			"the proxy leaves the generator with its stream")
	})
}

func names(t *testing.T, rs []*anypb.Any) []string {
	t.Helper()
	var out []string
	for _, r := range rs {
		var c clusterv3.Cluster
		require.NoError(t, r.UnmarshalTo(&c))
		out = append(out, c.GetName())
	}
	return out
}

func deltaNames(t *testing.T, rs []*discoverygrpc.Resource) []string {
	t.Helper()
	var out []string
	for _, r := range rs {
		out = append(out, r.GetName())
	}
	return out
}
