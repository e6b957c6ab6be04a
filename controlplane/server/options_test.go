package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// The defaults are istiod's where it has one (PILOT_PUSH_THROTTLE, PILOT_XDS_SEND_TIMEOUT,
// the reconnect window); admission follows capacity (in flight: derived from the throttle),
// with a generous queue and wait and no rate cap (PILOT_MAX_REQUESTS_PER_SECOND unset).
func TestDefaultsAreIstiods(t *testing.T) {
	assert.Equal(t, server.Options{PushThrottle: 100, SendTimeout: 5 * time.Second, ConnectQueue: 10000,
		ConnectWait: 30 * time.Second, ReconnectWindow: 10 * time.Second}, server.Defaults())
}

// cdsStream opens a SotW stream and asks for CDS.
func cdsStream(t *testing.T, ads discoverygrpc.AggregatedDiscoveryServiceClient) (discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
	t.Helper()
	st, _ := openCDS(t, ads, 10*time.Second)
	_, err := st.Recv()
	return st, err
}

// openCDS opens a SotW stream that ends after timeout (or with cancel) and asks for CDS.
func openCDS(t *testing.T, ads discoverygrpc.AggregatedDiscoveryServiceClient, timeout time.Duration) (
	discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	st, err := ads.StreamAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&discoverygrpc.DiscoveryRequest{Node: fakeNode(), TypeUrl: xds.ClusterType}))
	return st, cancel
}

// At most PushThrottle pushes are in flight at once, however many proxies a change
// concerns; a throttle of zero or less still pushes, one at a time.
func TestPushThrottleBoundsPushesInFlight(t *testing.T) {
	for _, tc := range []struct{ throttle, want int }{{0, 1}, {1, 1}, {2, 2}} {
		t.Run(fmt.Sprint("throttle ", tc.throttle), func(t *testing.T) {
			g := newFakeGenerator("v1", "a")
			opts := server.Defaults()
			opts.PushThrottle = tc.throttle
			// These streams never answer their config: the capacity gate, sized by the
			// throttle, would hold the next ones back.
			opts.ConnectInFlight = -1
			srv, ads := serveWith(t, opts, server.Deps{Generator: g})
			const proxies = 4
			for range proxies {
				_, err := cdsStream(t, ads)
				require.NoError(t, err)
			}
			release := g.hold(t)
			g.set("v2", "a", "b")
			g.push()
			require.Eventually(t, func() bool {
				now, _ := g.held()
				return now == tc.want && srv.Queued() == proxies-tc.want
			}, 5*time.Second, time.Millisecond)
			release()
			require.Eventually(t, srv.Idle, 5*time.Second, time.Millisecond)
			_, most := g.held()
			assert.Equal(t, tc.want, most, "pushes in flight at once")
		})
	}
}

// A delta request that changes no subscription of named resources (here a repeated ACK) gets
// no response, even when newer config waits in the server's queue for that proxy: the config
// reaches it with its push, in the push order, not ahead of it.
func TestARequestChangingNothingSendsNothing(t *testing.T) {
	g := newFakeGenerator("v1", "a")
	opts := server.Defaults()
	opts.PushThrottle = 1
	opts.ConnectInFlight = -1 // the proxies answer CDS only: no capacity gate sized by the throttle
	srv, ads := serveWith(t, opts, server.Deps{Generator: g})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var streams []discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	var nonces []string
	for i := range 2 {
		st, resp := deltaCDS(t, ctx, ads, "a", "b")
		require.Eventually(t, func() bool { return len(srv.Connections()) == i+1 && acks(srv.Connections()[i]) == 1 }, 5*time.Second, time.Millisecond)
		streams, nonces = append(streams, st), append(nonces, resp.GetNonce())
	}
	// The first proxy's push holds the one worker; the second's waits in the queue.
	release := g.hold(t)
	g.set("v2", "a", "b")
	g.push()
	require.Eventually(t, func() bool { now, _ := g.held(); return now == 1 && srv.Queued() == 1 }, 5*time.Second, time.Millisecond)
	second := srv.Connections()[1]
	for range 2 {
		require.NoError(t, streams[1].Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: xds.ClusterType, ResponseNonce: nonces[1]}))
	}
	require.Eventually(t, func() bool { return acks(second) == 3 }, 5*time.Second, time.Millisecond,
		"both repeated ACKs answer the response sent: nothing was sent in between")

	release()
	resp, err := streams[1].Recv()
	require.NoError(t, err)
	assert.Equal(t, "v2", resp.GetSystemVersionInfo())
	assert.Equal(t, []string{"b"}, deltaNames(t, resp.GetResources()))
}

// acks is the number of CDS ACKs a connection recorded.
func acks(c *server.Connection) int {
	for _, st := range c.SyncStatus() {
		if st.Type == "cds" {
			return st.Acks
		}
	}
	return 0
}

// A proxy that stops reading is cut off once a send has waited SendTimeout, so it cannot
// hold a push worker, and it leaves the generator; without a send timeout it is waited for.
func TestSendTimeoutCutsOffAProxyThatDoesNotRead(t *testing.T) {
	clusters := func(variant string) []string {
		var out []string
		for i := range 300 {
			out = append(out, fmt.Sprintf("%04d-%s", i, strings.Repeat(variant, 1000)))
		}
		return out
	}
	for _, tc := range []struct {
		timeout time.Duration
		cut     bool
	}{{200 * time.Millisecond, true}, {0, false}} {
		t.Run(fmt.Sprint("timeout ", tc.timeout), func(t *testing.T) {
			g := newFakeGenerator("v1", clusters("x")...)
			opts := server.Defaults()
			opts.SendTimeout = tc.timeout
			// Fixed, small windows: a 300 kB response cannot leave before the proxy reads.
			_, ads := serveWith(t, opts, server.Deps{Generator: g},
				grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := ads.StreamAggregatedResources(ctx)
			require.NoError(t, err)
			require.NoError(t, st.Send(&discoverygrpc.DiscoveryRequest{Node: fakeNode(), TypeUrl: xds.ClusterType}))
			// The first response leaves the server's hands whole (gRPC takes a message it has
			// quota for); the push after it waits for the proxy to read.
			require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.proxies) == 1 }, 5*time.Second, time.Millisecond)
			release := g.hold(t)
			g.set("v2", clusters("y")...)
			g.push()
			require.Eventually(t, func() bool { now, _ := g.held(); return now == 1 }, 5*time.Second, time.Millisecond)
			release()
			require.Eventually(t, func() bool { now, _ := g.held(); return now == 0 }, 5*time.Second, time.Millisecond)
			g.mu.Lock()
			p := g.proxies[0]
			g.mu.Unlock()
			closed := func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.closed }
			if !tc.cut {
				for _, want := range []string{"v1", "v2"} {
					resp, err := st.Recv()
					require.NoError(t, err)
					assert.Equal(t, want, resp.GetVersionInfo())
				}
				assert.False(t, closed())
				return
			}
			require.Eventually(t, closed, 5*time.Second, time.Millisecond, "the proxy left the generator")
			for err == nil { // what was sent before the cut, then the stream's end
				_, err = st.Recv()
			}
			assert.Contains(t, status.Convert(err).Message(), "send timed out")
		})
	}
}

// New connections are admitted through a token bucket (PILOT_MAX_REQUESTS_PER_SECOND): the
// burst at once, then one per 1/rate; a connection that would wait longer than ConnectWait
// is refused with RESOURCE_EXHAUSTED to retry with its own backoff, one that waits less (or
// any, without a cap) is admitted once its turn comes.
func TestConnectionsAreAdmittedAtTheConnectRate(t *testing.T) {
	cases := []struct {
		name      string
		rate      float64
		wait      time.Duration
		refused   bool
		connected int // before the one checked
	}{
		{name: "a wait past the cap is refused", rate: 1, wait: 10 * time.Millisecond, refused: true},
		{name: "a wait within the cap is admitted", rate: 20, wait: time.Second},
		{name: "without a cap every wait is admitted", rate: 20},
		{name: "no rate admits everything", connected: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := server.Defaults()
			opts.ConnectRate, opts.ConnectBurst, opts.ConnectWait = tc.rate, 1, tc.wait
			_, ads := serveWith(t, opts, server.Deps{Generator: newFakeGenerator("v1", "a")})
			for range 1 + tc.connected {
				_, err := cdsStream(t, ads)
				require.NoError(t, err)
			}
			_, err := cdsStream(t, ads)
			if !tc.refused {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, codes.ResourceExhausted, status.Code(err))
			_, err = cdsStream(t, ads)
			assert.Equal(t, codes.ResourceExhausted, status.Code(err), "refused again")
		})
	}
}
