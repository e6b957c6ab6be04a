package server_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// registrar records what the server tells auto-registration.
type registrar struct {
	mu     sync.Mutex
	events []string
}

func (r *registrar) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *registrar) Connect(w *model.Workload, startUnhealthy bool) {
	r.add("connect %s/%s unhealthy=%v", w.Namespace, w.Name, startUnhealthy)
}

func (r *registrar) Disconnect(w *model.Workload) { r.add("disconnect %s/%s", w.Namespace, w.Name) }

func (r *registrar) SetHealth(namespace, name string, healthy bool, reason string) {
	r.add("health %s/%s healthy=%v %q", namespace, name, healthy, reason)
}

func (r *registrar) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// workloadNode is a node with the workload metadata the agent sends.
func workloadNode(t *testing.T, healthChecked bool) *core.Node {
	t.Helper()
	meta, err := structpb.NewStruct(map[string]any{"NAME": "web-1", "NAMESPACE": "demo", "LABELS": map[string]any{"app": "web"},
		"INSTANCE_IPS": "10.9.0.1", "WASMESH_HEALTH_CHECKED": fmt.Sprint(healthChecked)})
	require.NoError(t, err)
	return &core.Node{Id: "sidecar~10.9.0.1~web-1.demo~demo.svc.cluster.local", Metadata: meta}
}

// A proxy with workload metadata registers its workload while it is connected. A
// health-checked one starts unhealthy until its agent reports, unless it resumes with config
// it already had (it was serving); one without health checks starts healthy.
func TestConnectedWorkloadsAreRegistered(t *testing.T) {
	cases := []struct {
		name                   string
		delta, resumed, health bool
		unhealthy              bool
	}{
		{name: "health checked", health: true, unhealthy: true},
		{name: "health checked, delta", delta: true, health: true, unhealthy: true},
		{name: "health checked, resumed", resumed: true, health: true},
		{name: "health checked, resumed delta", delta: true, resumed: true, health: true},
		{name: "not health checked"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := &registrar{}
			opts := server.Defaults()
			opts.ReconnectWindow = 0
			_, ads := serveWith(t, opts, server.Deps{Generator: newFakeGenerator("v1", "a"), AutoRegistration: reg})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			node := workloadNode(t, tc.health)
			var closeSend func() error
			if tc.delta {
				st, err := ads.DeltaAggregatedResources(ctx)
				require.NoError(t, err)
				req := &discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: xds.ClusterType}
				if tc.resumed {
					req.InitialResourceVersions = map[string]string{"a": "1"}
				}
				require.NoError(t, st.Send(req))
				closeSend = st.CloseSend
			} else {
				st, err := ads.StreamAggregatedResources(ctx)
				require.NoError(t, err)
				req := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: xds.ClusterType}
				if tc.resumed {
					req.VersionInfo = "v0"
				}
				require.NoError(t, st.Send(req))
				closeSend = st.CloseSend
			}
			connect := fmt.Sprintf("connect demo/web-1 unhealthy=%v", tc.unhealthy)
			require.Eventually(t, func() bool { return len(reg.got()) == 1 }, 5*time.Second, time.Millisecond)
			assert.Equal(t, []string{connect}, reg.got())
			require.NoError(t, closeSend())
			require.Eventually(t, func() bool { return len(reg.got()) == 2 }, 5*time.Second, time.Millisecond)
			assert.Equal(t, []string{connect, "disconnect demo/web-1"}, reg.got())
		})
	}
}

// An agent reports its workload's health on a stream of its own: a report without an
// error is healthy, one with an error is unhealthy for its reason; requests of other types
// on that stream are ignored, and it gets no responses. Reports need the workload's metadata
// and a registry to report to.
func TestHealthReportsReachTheRegistry(t *testing.T) {
	report := func(detail *statuspb.Status) *discoverygrpc.DiscoveryRequest {
		return &discoverygrpc.DiscoveryRequest{TypeUrl: server.HealthType, ErrorDetail: detail}
	}
	t.Run("reports", func(t *testing.T) {
		reg := &registrar{}
		_, ads := serveWith(t, server.Defaults(), server.Deps{Generator: newFakeGenerator("v1", "a"), AutoRegistration: reg})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := ads.StreamAggregatedResources(ctx)
		require.NoError(t, err)
		first := report(nil)
		first.Node = workloadNode(t, true)
		require.NoError(t, st.Send(first))
		require.NoError(t, st.Send(report(&statuspb.Status{Code: int32(codes.Unavailable), Message: "readiness probe failed"})))
		require.NoError(t, st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: xds.ClusterType}))
		require.NoError(t, st.Send(report(nil)))
		require.NoError(t, st.CloseSend())
		_, err = st.Recv()
		assert.ErrorIs(t, err, io.EOF, "no response, and the stream ends cleanly")
		assert.Equal(t, []string{`health demo/web-1 healthy=true ""`, `health demo/web-1 healthy=false "readiness probe failed"`,
			`health demo/web-1 healthy=true ""`}, reg.got())
	})
	for _, tc := range []struct {
		name string
		node *core.Node
		reg  server.Registrar
	}{
		{name: "without workload metadata", node: fakeNode(), reg: &registrar{}},
		{name: "without a registry", node: workloadNode(t, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ads := serveWith(t, server.Defaults(), server.Deps{Generator: newFakeGenerator("v1", "a"), AutoRegistration: tc.reg})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := ads.StreamAggregatedResources(ctx)
			require.NoError(t, err)
			first := report(nil)
			first.Node = tc.node
			require.NoError(t, st.Send(first))
			_, err = st.Recv()
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
		})
	}
}

// In the first minute after a start, a proxy that resumes with config it already had gets
// no update for ReconnectWindow (the registry is still filling up from the proxies coming
// back), then the config in force; a fresh proxy is served at once.
func TestResumingProxiesAreHeldAfterARestart(t *testing.T) {
	const resumedID = "sidecar~10.9.0.2~resumed-1.demo~demo.svc.cluster.local"
	resume := func(t *testing.T, ads discoverygrpc.AggregatedDiscoveryServiceClient) discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		st, err := ads.StreamAggregatedResources(ctx)
		require.NoError(t, err)
		node := fakeNode()
		node.Id = resumedID
		require.NoError(t, st.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: xds.ClusterType, VersionInfo: "v0"}))
		return st
	}
	t.Run("held", func(t *testing.T) {
		g := newFakeGenerator("v1", "a")
		opts := server.Defaults()
		opts.ReconnectWindow = time.Hour
		srv, ads := serveWith(t, opts, server.Deps{Generator: g})
		resume(t, ads)
		_, err := cdsStream(t, ads) // a fresh proxy
		require.NoError(t, err)
		require.Eventually(t, func() bool { return len(srv.Connections()) == 2 }, 5*time.Second, time.Millisecond)
		g.set("v2", "a", "b")
		g.push()
		require.Eventually(t, srv.Idle, 5*time.Second, time.Millisecond)
		sent := map[string]int{}
		for _, c := range srv.Connections() {
			st := c.SyncStatus()
			require.Len(t, st, 1)
			sent[c.Proxy.ID] = st[0].Sent
		}
		assert.Equal(t, map[string]int{resumedID: 0, fakeNode().GetId(): 2}, sent, "the resumed proxy got nothing, the fresh one both")
	})
	t.Run("released", func(t *testing.T) {
		opts := server.Defaults()
		opts.ReconnectWindow = 50 * time.Millisecond
		_, ads := serveWith(t, opts, server.Deps{Generator: newFakeGenerator("v2", "a", "b")})
		st := resume(t, ads)
		resp, err := st.Recv()
		require.NoError(t, err)
		assert.Equal(t, "v2", resp.GetVersionInfo(), "the config in force when the window ends")
		assert.Equal(t, []string{"a", "b"}, names(t, resp.GetResources()))
	})
}

// Connections are listed in the order they came (/debug/syncz), each once.
func TestConnectionsAreListedInOrder(t *testing.T) {
	srv, ads := serveWith(t, server.Defaults(), server.Deps{Generator: newFakeGenerator("v1", "a")})
	var want []string
	for range 3 {
		_, err := cdsStream(t, ads)
		require.NoError(t, err)
		for _, c := range srv.Connections() {
			if !slices.Contains(want, c.ID) {
				want = append(want, c.ID) // the new one
			}
		}
	}
	var ids []string
	for _, c := range srv.Connections() {
		ids = append(ids, c.ID)
	}
	assert.Equal(t, want, ids)
	assert.Same(t, srv.Connections()[0], srv.Connection(fakeNode().GetId()))
}
