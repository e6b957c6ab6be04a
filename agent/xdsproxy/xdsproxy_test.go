package xdsproxy

import (
	"context"
	"crypto/tls"
	"io"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/wasmesh/wasmesh/agent/internal/testca"
)

// sotw is Envoy's side of a State of the World stream: requests in Envoy's order, each
// response ACKed.
type sotw struct {
	t testing.TB
	s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
}

func openSotW(t testing.TB, c discoveryv3.AggregatedDiscoveryServiceClient) sotw {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	s, err := c.StreamAggregatedResources(ctx)
	require.NoError(t, err)
	return sotw{t: t, s: s}
}

// send sends req. A stream the proxy has already ended (its upstream refused) ends Send
// with io.EOF, as gRPC documents; the stream's status is what the next recv returns.
func (c sotw) send(req *discoveryv3.DiscoveryRequest) {
	if err := c.s.Send(req); err != io.EOF {
		require.NoError(c.t, err)
	}
}

// recv returns the next response's type, version and resource names.
func (c sotw) recv() (string, string, []string) {
	resp, err := c.s.Recv()
	require.NoError(c.t, err)
	names := make([]string, 0, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		switch resp.GetTypeUrl() {
		case resourcev3.ClusterType:
			var cl clusterv3.Cluster
			require.NoError(c.t, r.UnmarshalTo(&cl))
			names = append(names, cl.GetName())
		default:
			names = append(names, "?")
		}
	}
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	return resp.GetTypeUrl(), resp.GetVersionInfo(), names
}

// Envoy's order through the proxy: CDS first, its response, the ACK, then LDS; a push
// from discovery reaches the proxy for both types, each ACKed upstream (discovery sends
// the next version only after the ACK of the previous one).
func TestSotWThroughTheProxy(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	w := newWorkload(t, ca)
	d := startDiscovery(t, ca, w.token)
	p, sock := startProxy(t, w, d.addr)
	require.Error(t, p.Upstream(), "no stream yet")

	c := openSotW(t, dialSocket(t, sock))
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	typ, ver, names := c.recv()
	assert.Equal(t, resourcev3.ClusterType, typ)
	assert.Equal(t, "1", ver)
	assert.Equal(t, []string{"c1"}, names)
	require.NoError(t, p.Upstream(), "a stream to discovery is open")

	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ListenerType})
	typ, ver, _ = c.recv()
	assert.Equal(t, resourcev3.ListenerType, typ)
	assert.Equal(t, "1", ver)

	d.setConfig(2)
	got := map[string]string{}
	for range 2 {
		typ, ver, names := c.recv()
		got[typ] = ver
		if typ == resourcev3.ClusterType {
			assert.Equal(t, []string{"c2"}, names)
		}
	}
	assert.Equal(t, map[string]string{resourcev3.ClusterType: "2", resourcev3.ListenerType: "2"}, got)

	seen := d.seen()
	require.Len(t, seen, 1, "one stream upstream for one downstream")
	assert.Equal(t, "Bearer "+w.token, seen[0].authorization, "the credential is sent")
	require.NotNil(t, seen[0].clientCert, "the workload certificate is presented")
	assert.Equal(t, "spiffe://cluster.local/ns/ns/sa/sa", seen[0].clientCert.URIs[0].String())

	// The proxy half-closes: discovery ends the stream, and so does the XDS proxy.
	require.NoError(t, c.s.CloseSend())
	_, err := c.s.Recv()
	require.ErrorIs(t, err, io.EOF)
	require.Eventually(t, func() bool { return d.openStreams() == 0 }, 5*time.Second, 10*time.Millisecond)

	// The proxy goes away (its stream reset): the stream to discovery is cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	s, err := dialSocket(t, sock).StreamAggregatedResources(ctx)
	require.NoError(t, err)
	c = sotw{t: t, s: s}
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	c.recv()
	require.Equal(t, 1, d.openStreams())
	cancel()
	require.Eventually(t, func() bool { return d.openStreams() == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(p.m.envoyTerminations) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(p.m.istiodTerminations), "the first stream, ended by discovery")
}

// delta is Envoy's side of a Delta stream.
type delta struct {
	t testing.TB
	s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

func (c delta) recv() (string, []string) {
	resp, err := c.s.Recv()
	require.NoError(c.t, err)
	var names []string
	for _, r := range resp.GetResources() {
		names = append(names, r.GetName())
	}
	sort.Strings(names)
	require.NoError(c.t, c.s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}))
	return resp.GetTypeUrl(), names
}

func TestDeltaThroughTheProxy(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	w := newWorkload(t, ca)
	d := startDiscovery(t, ca, w.token)
	_, sock := startProxy(t, w, d.addr)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := dialSocket(t, sock).DeltaAggregatedResources(ctx)
	require.NoError(t, err)
	c := delta{t: t, s: s}
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType}))
	typ, names := c.recv()
	assert.Equal(t, resourcev3.ClusterType, typ)
	assert.Equal(t, []string{"c1"}, names)
	require.NoError(t, s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ListenerType}))
	typ, names = c.recv()
	assert.Equal(t, resourcev3.ListenerType, typ)
	assert.Equal(t, []string{"l1"}, names)

	d.setConfig(2)
	got := map[string][]string{}
	for range 2 {
		typ, names := c.recv()
		got[typ] = names
	}
	assert.Equal(t, map[string][]string{resourcev3.ClusterType: {"c2"}, resourcev3.ListenerType: {"l2"}}, got)
	assert.Len(t, d.seen(), 1)
}

// Discovery going away ends the proxy's stream with Unavailable (Envoy reconnects with its
// back-off); the next stream reaches the restarted discovery, and the agent sees the
// upstream go and come back.
func TestUpstreamRestartEndsTheStreamAndReconnects(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	w := newWorkload(t, ca)
	d := startDiscovery(t, ca, w.token)
	reg := prometheus.NewRegistry()
	p, err := New(Config{Address: d.addr, DialOptions: w.dialConfig(d.addr).DialOptions(), Registry: reg})
	require.NoError(t, err)
	sock := serve(t, p)
	client := dialSocket(t, sock)

	c := openSotW(t, client)
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	_, ver, _ := c.recv()
	require.Equal(t, "1", ver)
	require.NoError(t, p.Upstream())

	d.restart()
	_, err = c.s.Recv()
	errContains(t, err, codes.Unavailable, "XDS proxy: discovery "+d.addr)
	require.Eventually(t, func() bool { return p.Upstream() != nil }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(p.m.istiodTerminations))

	d.setConfig(3)
	c = openSotW(t, client)
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	_, ver, names := c.recv()
	assert.Equal(t, "3", ver)
	assert.Equal(t, []string{"c3"}, names)
	require.NoError(t, p.Upstream())
	assert.Equal(t, 1.0, testutil.ToFloat64(p.m.upstreams))
}

func serve(t testing.TB, p *Proxy) string {
	sock := t.TempDir() + "/XDS"
	l, err := Listen(sock)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return sock
}

// A server whose certificate does not chain to the mesh root, or names another server, is
// refused before anything is sent to it; a refused credential ends the stream with
// discovery's Unauthenticated.
func TestRefusedUpstreams(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	w := newWorkload(t, ca)

	foreign := testca.Start(t, time.Hour)
	fd := startDiscovery(t, foreign, w.token)
	p, sock := startProxy(t, w, fd.addr)
	c := openSotW(t, dialSocket(t, sock))
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	_, err := c.s.Recv()
	errContains(t, err, codes.Unavailable, "not trusted by "+w.rootFile)
	assert.Empty(t, fd.seen(), "no stream reached the foreign server")
	require.Error(t, p.Upstream())
	assert.Contains(t, p.Upstream().Error(), "not trusted")

	d := startDiscovery(t, ca, w.token)
	other := w
	other.serverName = "istiod.elsewhere.svc"
	_, sock = startProxy(t, other, d.addr)
	c = openSotW(t, dialSocket(t, sock))
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	_, err = c.s.Recv()
	errContains(t, err, codes.Unavailable, "not istiod.elsewhere.svc")
	assert.Empty(t, d.seen())

	stranger := w
	stranger.tokenFile = ca.Allow(t, "someone-else", "cluster.local", "ns", "sa")
	_, sock = startProxy(t, stranger, d.addr)
	c = openSotW(t, dialSocket(t, sock))
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	_, err = c.s.Recv()
	errContains(t, err, codes.Unauthenticated, "unknown credential")
	require.Len(t, d.seen(), 1)
	assert.Equal(t, "Bearer someone-else", d.seen()[0].authorization)
}

func TestBadConfig(t *testing.T) {
	_, err := New(Config{Address: "istiod", DialOptions: newWorkload(t, testca.Start(t, time.Hour)).dialConfig("x:1").DialOptions()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `discovery address "istiod"`)
	_, err = New(Config{Address: "istiod:15012"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no dial options")
}

// Each of the proxy's streams dials discovery anew, so a renewed workload certificate is
// presented from the next stream on (TLS sends it only in the handshake).
func TestRenewedCertificateOnTheNextStream(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	w := newWorkload(t, ca)
	d := startDiscovery(t, ca, w.token)
	var current atomic.Pointer[tls.Certificate]
	current.Store(w.cert)
	cfg := w.dialConfig(d.addr)
	cfg.ClientCertificate = current.Load
	p, err := New(Config{Address: d.addr, DialOptions: cfg.DialOptions()})
	require.NoError(t, err)
	client := dialSocket(t, serve(t, p))

	first := openSotW(t, client)
	first.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	first.recv()
	chain, key := ca.Issue(t, "spiffe://cluster.local/ns/ns/sa/renewed", time.Hour)
	renewed, err := tls.X509KeyPair(chain, key)
	require.NoError(t, err)
	current.Store(&renewed)
	second := openSotW(t, client)
	second.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	second.recv()

	seen := d.seen()
	require.Len(t, seen, 2)
	assert.Equal(t, "spiffe://cluster.local/ns/ns/sa/sa", seen[0].clientCert.URIs[0].String())
	assert.Equal(t, "spiffe://cluster.local/ns/ns/sa/renewed", seen[1].clientCert.URIs[0].String())
}
