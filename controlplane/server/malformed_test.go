package server_test

import (
	"context"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/controlplane/server"
)

// ended requires a stream to have ended with code and a message containing msg.
func ended(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	require.Error(t, err)
	assert.Equal(t, code, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), msg)
}

// firstRequest opens a stream of either variant, sends one request built from node and
// type URL, and returns the proxy for what follows.
func (m *testMesh) firstRequest(delta bool, n *core.Node, typ string) *proxy {
	p := m.open(1, delta)
	if delta {
		p.dstr.request(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: typ})
	} else {
		p.sotw.request(&discoverypb.DiscoveryRequest{Node: n, TypeUrl: typ})
	}
	p.sentNode = true
	return p
}

func (p *proxy) end() error {
	if p.delta {
		return p.dstr.end()
	}
	return p.sotw.end()
}

// Requests Envoy would never send end their stream with a status that says what is wrong;
// a type the server does not serve is answered with nothing of it; none of them stops the
// server serving other proxies.
func TestMalformedRequestsGetAClearErrorAndHarmNothing(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		base := newMesh(t)
		t.Run("no node", func(t *testing.T) {
			m := base.in(t)
			ended(t, m.firstRequest(delta, nil, cdsType).end(), codes.InvalidArgument, "node id is required")
		})
		t.Run("node id not Istio's", func(t *testing.T) {
			m := base.in(t)
			ended(t, m.firstRequest(delta, &core.Node{Id: "envoy-1"}, cdsType).end(), codes.InvalidArgument, "want 4 parts")
		})
		t.Run("no type URL", func(t *testing.T) {
			m := base.in(t)
			ended(t, m.firstRequest(delta, node(t, 1), "").end(), codes.InvalidArgument, "type URL is required")
			p := m.firstRequest(delta, node(t, 1), cdsType)
			p.nextOf(cdsType)
			p.raw("", "", nil, nil, nil, nil)
			ended(t, p.end(), codes.InvalidArgument, "type URL is required")
		})
		t.Run("unknown type URL", func(t *testing.T) {
			m := base.in(t)
			const unknown = "type.googleapis.com/envoy.config.unknown.v3.Thing"
			p := m.open(1, delta)
			p.want(unknown, "thing-1")
			if !delta {
				// SotW answers every subscription; of a type it does not serve, with nothing.
				r := p.nextOf(unknown)
				assert.Empty(t, r.names)
				assert.NotEmpty(t, r.nonce)
			}
			// The stream goes on: the next response is the clusters asked for next.
			p.want(cdsType)
			assert.Equal(t, meshClusters, p.nextOf(cdsType).names)
		})
		t.Run("not a discovery request", func(t *testing.T) {
			m := base.in(t)
			method := "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
			if delta {
				method = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := m.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodecV2(bytesCodec{}))
			require.NoError(t, err)
			require.NoError(t, st.SendMsg([]byte{0xff, 0xff, 0xff, 0xff}))
			var b []byte
			ended(t, st.RecvMsg(&b), codes.Internal, "unmarshal")
		})
		// The server still serves.
		m := base.in(t)
		_, got := m.connect(2, delta)
		assert.Equal(t, meshClusters, got[cdsType].names)
		m.waitSyncz(proxyID(2), "the new proxy", func(map[string]server.TypeStatus) bool { return true })
		// The streams that ended (refused, or closed by their subtest) left no connection
		// behind: this proxy is the only one.
		require.Eventually(t, func() bool { return len(m.srv.Connections()) == 1 }, waitFor, 2*time.Millisecond,
			"connections left behind")
	})
}

// bytesCodec sends and receives messages as raw bytes.
type bytesCodec struct{}

func (bytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (bytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (bytesCodec) Name() string { return "proto" }
