package xdsproxy

import (
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/agent/internal/testca"
)

// flood is a discovery that answers the first request with responses as fast as the
// stream takes them, counting those gRPC accepted.
type flood struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	sent atomic.Int64
}

func (f *flood) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	big := &anypb.Any{TypeUrl: resourcev3.ClusterType, Value: make([]byte, 64<<10)}
	for {
		if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: resourcev3.ClusterType, Resources: []*anypb.Any{big}}); err != nil {
			return err
		}
		f.sent.Add(1)
	}
}

// A proxy that stops reading stops discovery: the XDS proxy holds no queue of its own, so
// what discovery can send is bounded by the flow-control windows on the way, far below what
// it tries to send.
func TestSlowProxyHoldsDiscoveryBack(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	w := newWorkload(t, ca)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.ServingCert(t)}})))
	f := &flood{}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, f)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	_, sock := startProxy(t, w, l.Addr().String())

	c := openSotW(t, dialSocket(t, sock))
	c.send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: resourcev3.ClusterType})
	// Never read: wait until discovery's sends stop for good.
	last := int64(-1)
	require.Eventually(t, func() bool {
		n := f.sent.Load()
		stalled := n == last
		last = n
		return stalled && n > 0
	}, 20*time.Second, 300*time.Millisecond)
	sentMiB := float64(last) * 64 / 1024
	t.Logf("discovery stalled after %d responses (%.1f MiB) with the proxy not reading", last, sentMiB)
	assert.Less(t, sentMiB, 16.0, "bounded by flow control, not queued by the XDS proxy")

	// Reading again lets everything through, in order of sending.
	for range 10 {
		_, err := c.s.Recv()
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return f.sent.Load() > last }, 10*time.Second, 10*time.Millisecond)
}
