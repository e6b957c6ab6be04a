package server_test

import (
	"context"
	"io"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// proxyStream is a SotW stream asking for clusters, and listeners unless told otherwise.
type proxyStream struct {
	st     discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cancel context.CancelFunc
	// first delivers the stream's first response, or its error.
	first chan error
	cds   *discoverygrpc.DiscoveryResponse
}

func openProxy(t *testing.T, ads discoverygrpc.AggregatedDiscoveryServiceClient, clustersOnly ...bool) *proxyStream {
	t.Helper()
	st, cancel := openCDS(t, ads, 20*time.Second)
	if len(clustersOnly) == 0 || !clustersOnly[0] {
		// A stream the server has already refused ends this Send with io.EOF; its status
		// is what Recv returns, below.
		if err := st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: xds.ListenerType}); err != io.EOF {
			require.NoError(t, err)
		}
	}
	p := &proxyStream{st: st, cancel: cancel, first: make(chan error, 1)}
	go func() {
		var err error
		p.cds, err = st.Recv()
		p.first <- err
	}()
	return p
}

// served reports whether the proxy got its first response within d; an error is returned
// as is.
func (p *proxyStream) served(d time.Duration) (bool, error) {
	select {
	case err := <-p.first:
		return err == nil, err
	case <-time.After(d):
		return false, nil
	}
}

func requireServed(t *testing.T, p *proxyStream) {
	t.Helper()
	ok, err := p.served(5 * time.Second)
	require.NoError(t, err)
	require.True(t, ok, "served")
}

func requireWaiting(t *testing.T, p *proxyStream, why string) {
	t.Helper()
	ok, err := p.served(200 * time.Millisecond)
	require.NoError(t, err)
	require.False(t, ok, why)
}

// ack ACKs a response (which frees no admission slot: sending does).
func (p *proxyStream) ack(t *testing.T, resp *discoverygrpc.DiscoveryResponse) {
	t.Helper()
	require.NoError(t, p.st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}))
}

// With room for one initial config in flight, the proxies of a storm wait with their
// streams open and are served first come first served as each one before them has been
// sent its clusters and listeners, or leaves; none is refused.
func TestConnectionsWaitForCapacityInArrivalOrder(t *testing.T) {
	opts := server.Defaults()
	opts.ConnectInFlight = 1
	srv, ads := serveWith(t, opts, server.Deps{Generator: newFakeGenerator("v1", "a")})

	// a and b ask for listeners only once their clusters are in, as Envoy does.
	a := openProxy(t, ads, true)
	requireServed(t, a)
	b := openProxy(t, ads, true)
	require.Eventually(t, func() bool { return srv.Waiting() == 1 }, 5*time.Second, time.Millisecond)
	c := openProxy(t, ads)
	require.Eventually(t, func() bool { return srv.Waiting() == 2 }, 5*time.Second, time.Millisecond)
	requireWaiting(t, b, "b waits while a's initial config is in flight")

	a.ack(t, a.cds)
	requireWaiting(t, b, "b waits until a has its listeners too")
	require.NoError(t, a.st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: xds.ListenerType}))
	lds, err := a.st.Recv()
	require.NoError(t, err)
	require.Equal(t, xds.ListenerType, lds.GetTypeUrl())
	requireServed(t, b)
	requireWaiting(t, c, "c, behind b, waits for b")
	assert.Equal(t, 1, srv.Waiting())

	b.cancel() // b leaves before its listeners: its place goes to c
	requireServed(t, c)
	assert.Equal(t, 0, srv.Waiting())
	require.Eventually(t, func() bool { return len(srv.Connections()) == 2 }, 5*time.Second, time.Millisecond,
		"a and c connected, b gone, none refused")
}

// A connection is refused (RESOURCE_EXHAUSTED, to retry with its backoff) only when the
// queue is full or its wait passes ConnectWait.
func TestAdmissionRefusesPastTheQueueOrTheWait(t *testing.T) {
	t.Run("queue full", func(t *testing.T) {
		opts := server.Defaults()
		opts.ConnectInFlight, opts.ConnectQueue = 1, 1
		srv, ads := serveWith(t, opts, server.Deps{Generator: newFakeGenerator("v1", "a")})
		requireServed(t, openProxy(t, ads, true))
		waiting := openProxy(t, ads)
		require.Eventually(t, func() bool { return srv.Waiting() == 1 }, 5*time.Second, time.Millisecond)
		_, err := openProxy(t, ads).served(5 * time.Second)
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		requireWaiting(t, waiting, "the one in the queue keeps its place")
	})
	t.Run("wait too long", func(t *testing.T) {
		opts := server.Defaults()
		opts.ConnectInFlight, opts.ConnectWait = 1, 100*time.Millisecond
		srv, ads := serveWith(t, opts, server.Deps{Generator: newFakeGenerator("v1", "a")})
		requireServed(t, openProxy(t, ads, true))
		start := time.Now()
		_, err := openProxy(t, ads).served(5 * time.Second)
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
		assert.Equal(t, 0, srv.Waiting())
		// The refused one gave no slot away: a newcomer is refused as well.
		_, err = openProxy(t, ads).served(5 * time.Second)
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	})
}

// A proxy resuming with its config just after a restart gets nothing during the reconnect
// window, so it holds no admission slot: the fresh proxy behind it is served at once.
func TestResumedProxyHoldsNoAdmissionSlot(t *testing.T) {
	opts := server.Defaults()
	opts.ConnectInFlight = 1
	srv, ads := serveWith(t, opts, server.Deps{Generator: newFakeGenerator("v1", "a")})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resumed, err := ads.StreamAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, resumed.Send(&discoverygrpc.DiscoveryRequest{Node: fakeNode(), TypeUrl: xds.ClusterType, VersionInfo: "v0"}))
	require.NoError(t, resumed.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: xds.ListenerType, VersionInfo: "v0"}))
	require.Eventually(t, func() bool { return len(srv.Connections()) == 1 }, 5*time.Second, time.Millisecond)
	requireServed(t, openProxy(t, ads, true))
}
